"""Replay: a candidate policy re-decides logged requests, compared with what was served."""
