"""The page (Streamlit): the views the frame (`streamlit_app.py`) navigates between, the sections they share, and
the plain-Python models behind them. It may import everything of ours; nothing of ours imports it."""
