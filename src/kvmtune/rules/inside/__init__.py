"""Rules about the inside of a running guest, as its QEMU guest agent told it (``Guest.inside``)."""
