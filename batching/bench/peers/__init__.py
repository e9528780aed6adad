"""The bench's peers, in one place: the engines our batchers are raced against and the servers they run.

- `hf_peer`: transformers' own continuous batching, in this process.
- `llamacpp_peer`, `llamacpp_server`, `gguf_convert`: llama.cpp's server on a GGUF copy of the model.
- `vllm_peer`, `vllm_server`: vLLM's server, from its own environment, on the same model folder.
- `serve_peer`: our server beside `transformers serve` and vLLM's, driven by guidellm (and the sweep's servers).
- `local_server`, `peer_loop`: what the servers and the peers share: a server process on a free port, and the loop
  that runs a plan's requests on a peer.
"""
