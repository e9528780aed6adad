"""Turn "these rows get these new tokens" into one forward pass of a transformers model over the slot cache."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from batching.kv_cache import SlotKVCache, StepPlan


class ModelRunner:
    """Owns the model's forward pass and the KV cache; knows nothing of requests or scheduling.

    Every forward takes all rows in use. A row's new tokens may be a prompt chunk, one decode token, or nothing
    (it waits this step). Rows are right-aligned in the query window so each row's last new token is the last
    query position: the LM head then runs on one position per row. Alignment padding writes to a scratch column.
    """

    def __init__(self, model: PreTrainedModel, capacity: int, max_len: int, pad_token_id: int) -> None:
        self.model = model
        self.device = model.device
        self.max_len = max_len
        self.pad_token_id = pad_token_id
        num_layers = model.config.get_text_config().num_hidden_layers
        self.cache = SlotKVCache(num_layers, capacity, max_len, self.device)
        self._mask_min = torch.finfo(model.dtype).min
        self._columns = torch.arange(max_len + 1, device=self.device)
        self.forward_calls = 0

    @torch.inference_mode()
    def forward(self, row_tokens: list[list[int]], new_padding: list[int] | None = None) -> torch.Tensor:
        """Run one step; returns float32 logits `[rows, vocab]` at each row's last new token.

        `new_padding[r]` > 0 says the first tokens of row r are left padding (the static baseline's waves).
        """
        cache = self.cache
        rows = len(row_tokens)
        if rows != cache.active_rows:
            raise ValueError(f"got tokens for {rows} rows but {cache.active_rows} rows are in use")
        query_len = max(1, max(len(tokens) for tokens in row_tokens))
        if new_padding:
            for row, count in enumerate(new_padding):
                if count:
                    cache.mark_padding(row, cache.lengths[row] + count)

        input_ids, write_columns, positions, limits, self_columns = [], [], [], [], []
        kv_len = 1
        for row, tokens in enumerate(row_tokens):
            align = query_len - len(tokens)
            start = cache.lengths[row]
            position = cache.position_of_next(row)
            input_ids.extend([self.pad_token_id] * align + tokens)
            write_columns.extend([cache.scratch_column] * align + list(range(start, start + len(tokens))))
            positions.extend([0] * align + [max(0, position + j) for j in range(len(tokens))])
            limits.extend([-1] * align + list(range(start, start + len(tokens))))
            self_columns.extend([0] * align + list(range(start, start + len(tokens))))
            kv_len = max(kv_len, start + len(tokens))
        if kv_len > self.max_len:
            raise ValueError(f"a row would hold {kv_len} tokens but the cache holds at most {self.max_len}")

        shape = (rows, query_len)
        device = self.device
        write = torch.tensor(write_columns, device=device).view(shape)
        limit = torch.tensor(limits, device=device).view(*shape, 1)
        own = torch.tensor(self_columns, device=device).view(*shape, 1)
        columns = self._columns[:kv_len]
        allowed = columns <= limit
        if any(cache.padding[:rows]):
            allowed &= ~cache.blocked[:rows, None, :kv_len]
        allowed |= columns == own  # padding queries attend one column so no softmax row is empty
        mask = torch.zeros((rows, 1, query_len, kv_len), dtype=self.model.dtype, device=device)
        mask.masked_fill_(~allowed[:, None], self._mask_min)

        cache.plan = StepPlan(
            rows=rows,
            row_index=torch.arange(rows, device=device).view(rows, 1),
            write_columns=write,
            kv_len=kv_len,
        )
        output = self.model(
            input_ids=torch.tensor(input_ids, device=device).view(shape),
            position_ids=torch.tensor(positions, device=device).view(shape),
            attention_mask=mask,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        for row, tokens in enumerate(row_tokens):
            cache.lengths[row] += len(tokens)
        self.forward_calls += 1
        return output.logits[:, -1, :].float()
