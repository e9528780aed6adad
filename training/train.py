"""Rebuild the embedded model from scratch: corpus, byte-level BPE tokenizer and a small Llama, trained on CPU.

Run `python -m training.train [--out model/builtin] [--steps N]`. Everything is seeded, so the same
arguments on the same machine give the same model. The loss counts only answer tokens and the EOS. The corpus is
drawn (`training.corpus`) from the intents in `training/intents.json`: edit the data there, the drawing in corpus.py.
"""

from __future__ import annotations

import argparse
import math
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from model.loader import BUILTIN_MODEL_DIR
from model.prompting import format_prompt
from training.corpus import Example, training_examples

SPECIAL_TOKENS = ("<s>", "</s>", "<pad>")  # ids 0, 1, 2
IGNORE = -100


@dataclass(frozen=True)
class Encoded:
    """One training example as token ids; the loss is taken from `prompt_len` on (answer and EOS)."""

    ids: list[int]
    prompt_len: int


def train_tokenizer(examples: Sequence[Example], vocab_size: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE on the formatted prompts and answers: any Unicode text round-trips through it."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = (text for example in examples for text in (format_prompt(example.question), " " + example.answer))
    tokenizer.train_from_iterator(texts, trainer=trainer)
    bos, eos, pad = SPECIAL_TOKENS
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=bos,
        eos_token=eos,
        pad_token=pad,
        clean_up_tokenization_spaces=False,
        model_max_length=1024,
    )


def encode(tokenizer: PreTrainedTokenizerFast, examples: Sequence[Example]) -> list[Encoded]:
    """Prompt ids + answer ids + EOS, with prompt and answer tokenized apart as at inference.

    At inference the app tokenizes `format_prompt(question)` alone, so training must see the same ids.
    """
    prompts = tokenizer([format_prompt(example.question) for example in examples])["input_ids"]
    answers = tokenizer([" " + example.answer for example in examples])["input_ids"]
    eos = tokenizer.eos_token_id
    return [Encoded(prompt + answer + [eos], len(prompt)) for prompt, answer in zip(prompts, answers, strict=True)]


def build_model(tokenizer: PreTrainedTokenizerFast, seed: int) -> LlamaForCausalLM:
    """A ~4.1M-parameter Llama: RoPE, grouped-query attention (8 heads, 2 KV heads), RMSNorm, tied embeddings."""
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=6,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def batches(data: Sequence[Encoded], max_tokens: int, pad_id: int, rng: random.Random) -> Iterator[tuple]:
    """Endless shuffled batches of similar length, each at most `max_tokens` padded tokens.

    Padding goes on the right, so under the causal mask no real token sees a pad and no attention mask
    is needed; pads and prompt tokens get the IGNORE label.
    """
    while True:
        order = list(range(len(data)))
        rng.shuffle(order)
        groups = []
        for start in range(0, len(order), 512):
            chunk = sorted(order[start : start + 512], key=lambda i: len(data[i].ids))
            group: list[int] = []
            for index in chunk:
                longest = max(len(data[index].ids), *(len(data[i].ids) for i in group)) if group else 0
                if group and longest * (len(group) + 1) > max_tokens:
                    groups.append(group)
                    group = []
                group.append(index)
            groups.append(group)
        rng.shuffle(groups)
        for group in groups:
            yield _collate([data[i] for i in group], pad_id)


def _collate(items: Sequence[Encoded], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(item.ids) for item in items)
    input_ids = torch.full((len(items), width), pad_id, dtype=torch.long)
    labels = torch.full((len(items), width), IGNORE, dtype=torch.long)
    for row, item in enumerate(items):
        ids = torch.tensor(item.ids)
        input_ids[row, : len(ids)] = ids
        labels[row, item.prompt_len : len(ids)] = ids[item.prompt_len :]
    return input_ids, labels


def learning_rate(step: int, steps: int, peak: float, warmup: int) -> float:
    """Linear warm-up, then cosine decay to a tenth of the peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train(model: LlamaForCausalLM, data: Sequence[Encoded], args: argparse.Namespace, pad_id: int) -> None:
    """Plain AdamW loop with a cosine schedule, printing the answer-token loss as it goes."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.05)
    stream = batches(data, args.batch_tokens, pad_id, random.Random(args.seed))
    model.train()
    started, running = time.perf_counter(), 0.0
    for step in range(args.steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, args.steps, args.lr, args.warmup)
        input_ids, labels = next(stream)
        loss = model(input_ids=input_ids, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        running = loss.item() if step == 0 else 0.9 * running + 0.1 * loss.item()
        if step % args.log_every == 0 or step == args.steps - 1:
            elapsed = time.perf_counter() - started
            rate = optimizer.param_groups[0]["lr"]
            print(f"step {step:5d}/{args.steps}  loss {running:.4f}  lr {rate:.2e}  {elapsed:6.0f} s", flush=True)
    model.eval()


def save(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, out: Path) -> None:
    """Write config, float32 safetensors weights, generation config and tokenizer into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=False,
        max_new_tokens=256,
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=BUILTIN_MODEL_DIR, help="folder to write the model into")
    parser.add_argument("--steps", type=int, default=1000, help="optimizer steps")
    parser.add_argument("--examples", type=int, default=30000, help="training examples to generate")
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--batch-tokens", type=int, default=2048, help="padded tokens per batch")
    parser.add_argument("--lr", type=float, default=2e-3, help="peak learning rate")
    parser.add_argument("--warmup", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (on a shared 2-core CPU, 1 was 4x faster than 2)"
    )
    parser.add_argument("--log-every", type=int, default=25)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    examples = training_examples(args.examples, seed=args.seed)
    tokenizer = train_tokenizer(examples, args.vocab_size)
    data = encode(tokenizer, examples)
    lengths = sorted(len(item.ids) for item in data)
    median = lengths[len(lengths) // 2]
    print(
        f"{len(data)} examples, vocab {len(tokenizer)}, tokens per example: median {median}, max {lengths[-1]}",
        flush=True,
    )
    model = build_model(tokenizer, args.seed)
    print(f"{model.num_parameters():,} parameters", flush=True)
    train(model, data, args, tokenizer.pad_token_id)
    save(model, tokenizer, args.out)
    print(f"saved to {args.out} after {time.perf_counter() - started:.0f} s in all")


if __name__ == "__main__":
    main()
