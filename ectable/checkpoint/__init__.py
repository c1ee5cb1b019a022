"""The checkpoint tier (Check-N-Run): what a checkpoint stores of each row, and, as it is built,
its snapshot, writing and restore."""
