"""`python -m helmline.cli`: how `helmline up` starts services with its own interpreter."""

from helmline.cli import app

app()
