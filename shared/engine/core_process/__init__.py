"""The engine core in a child process: messages, the child's loop, and the service-side client."""
