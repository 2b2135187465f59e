"""The executor hub: executors connected over executors.sock, their queues and their answers."""
