"""Worker processes: process groups, timeouts, escaped descendants."""
