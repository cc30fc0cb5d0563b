"""Memory accounting: process RSS, malloc arenas, per-component bytes, idle trimming."""
