"""The checkpoint tier's formats and decisions (Check-N-Run): how stored rows are quantized, a
checkpoint's files, the policies, a chain of checkpoints. The nodes' snapshots are in
`ectable.storage.snapshots`, taking and restoring in `ectable.client.checkpoints`."""
