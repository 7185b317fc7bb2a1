"""Makes `python -m pytest` from this folder import the local package."""
