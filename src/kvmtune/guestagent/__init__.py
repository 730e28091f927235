"""Reading the inside of a running guest through its QEMU guest agent (read-only)."""
