"""The page's views, one script each, run by the frame (`streamlit_app.py`) through `st.navigation`."""
