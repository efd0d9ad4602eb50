"""A person's control over running work: messages to a run (steer, queue, interrupt), forks of
a run and attempts side by side."""
