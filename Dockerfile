# Batchscope: the app on the embedded model, headless, as a non-root user.
# TORCH_VARIANT=cpu (default) installs the CPU wheel; TORCH_VARIANT=cuda installs torch's CUDA build instead.
FROM python:3.11-slim

ARG TORCH_VARIANT=cpu
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    HF_HOME=/models/hf

RUN useradd --create-home --uid 1000 batchscope
WORKDIR /app

COPY requirements.txt requirements-gptq.txt ./
# Same install as the README; the CUDA variant takes torch from PyTorch's CUDA index first.
# g++: torch.compile builds the compiled decode steps' kernels with it (without it they stay eager, and the page
# says so). libtcmalloc-minimal4: `python -m batching.serve` and the benchmark run on TCMalloc (batching/allocator.py).
RUN apt-get update && apt-get install -y --no-install-recommends g++ libtcmalloc-minimal4 && rm -rf /var/lib/apt/lists/*
RUN if [ "$TORCH_VARIANT" = "cuda" ]; then \
        pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128; \
    fi && \
    pip install -r requirements.txt

COPY --chown=batchscope:batchscope . .
RUN mkdir -p /models/hf && chown -R batchscope:batchscope /models
VOLUME ["/models"]

USER batchscope
# 8000: the OpenAI-compatible API, when started with BATCHSCOPE_SERVER__PORT=8000 and BATCHSCOPE_SERVER__HOST=0.0.0.0
# (inside the app's process) or as `python -m batching.serve --host 0.0.0.0 --port 8000` (on its own).
EXPOSE 8501 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD python -c "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://localhost:8501/_stcore/health').read() != b'ok')"

CMD ["streamlit", "run", "streamlit_app.py", "--server.headless=true", "--server.address=0.0.0.0", "--server.port=8501", "--browser.gatherUsageStats=false"]
