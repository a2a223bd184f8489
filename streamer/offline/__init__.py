"""Whole recordings: reading audio files, offline transcription, transcript formats and scoring."""
