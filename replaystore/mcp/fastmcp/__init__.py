"""FastMCP 4: resumable apps and durable tasks through FastMCP's own seams."""
