"""The wire protocol: input validation shared by clients and nodes."""
