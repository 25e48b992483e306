"""Running a stage: the interleaved runner, preflight, resume, the host log, anchors (docs/running.md)."""
