"""Call-centre and compatibility endpoints over the same stream core: Twilio Media Streams, OpenAI Realtime
transcription, the call hub with its followers and delivery sinks."""
