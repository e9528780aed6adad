"""The engine: requests, scheduling, a slot KV cache, one model runner, and the continuous and static batchers.

Nothing here imports Streamlit: the page, the benchmark CLI and the tests all drive it directly.
"""
