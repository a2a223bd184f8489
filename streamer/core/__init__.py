"""The sans-I/O streaming core: audio, voice activity, windows, agreement and the stream core that turns
audio into transcript events. Nothing here awaits, reads the clock or runs the model."""
