"""The built-in four-role coding agent."""
