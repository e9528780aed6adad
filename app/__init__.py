"""The page (Streamlit): one folder per view the frame (`streamlit_app.py`) navigates between (`race`,
`shared_engine`, `remote`, `sweep`: each its page script, its run, its state and its own sections), and `common`,
what several views share (the frame, the sidebar, the queue, the live run and its streaming loop, the sections the
built-in engine's views draw alike). It may import everything of ours; nothing of ours imports it."""
