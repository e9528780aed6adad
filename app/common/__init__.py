"""What several views share: the frame and the sidebar, the queue (its model and its section), a run's live view,
its follower (baton) and its streaming loop, a view's run, and the sections more than one view draws."""
