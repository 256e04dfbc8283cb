"""Client side: resuming sessions, events delivered once, and tools called as durable tasks."""
