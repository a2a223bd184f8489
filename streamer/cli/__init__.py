"""The ``streamer`` command line and its client-side commands."""
