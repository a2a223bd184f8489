// The capture AudioWorklet: microphone frames (at the AudioContext's rate, usually 48 kHz) in, 16 kHz mono PCM16
// chunks out to the page through the port, with the chunk's level for the meter. Runs on the audio thread, so it
// allocates only one chunk buffer per 100 ms.

import { Resampler, TARGET_RATE, toPcm16 } from "./resample.js";

const CHUNK_SAMPLES = TARGET_RATE / 10; // 100 ms per message and per WebSocket frame

class Pcm16Capture extends AudioWorkletProcessor {
  constructor() {
    super();
    // `sampleRate` is the AudioWorkletGlobalScope's: the context's rate
    this.resampler = new Resampler(sampleRate, TARGET_RATE);
    this.chunk = new Int16Array(CHUNK_SAMPLES);
    this.filled = 0;
    this.sumSquares = 0;
    this.peak = 0;
    this.mono = new Float32Array(128);
    this.emit = (sample) => {
      this.chunk[this.filled++] = toPcm16(sample);
      this.sumSquares += sample * sample;
      this.peak = Math.max(this.peak, Math.abs(sample));
      if (this.filled === CHUNK_SAMPLES) this.flush();
    };
    this.port.onmessage = (event) => {
      if (event.data === "flush") {
        this.flush();
        this.port.postMessage({ flushed: true });
      }
    };
  }

  flush() {
    if (this.filled === 0) return;
    const pcm = this.chunk.slice(0, this.filled);
    const rms = Math.sqrt(this.sumSquares / this.filled);
    this.port.postMessage({ pcm, rms, peak: this.peak }, [pcm.buffer]);
    this.filled = 0;
    this.sumSquares = 0;
    this.peak = 0;
  }

  process(inputs) {
    const channels = inputs[0];
    if (!channels || channels.length === 0) return true; // no input connected yet
    let mono = channels[0];
    if (channels.length > 1) {
      if (this.mono.length !== mono.length) this.mono = new Float32Array(mono.length);
      this.mono.fill(0);
      for (const channel of channels) {
        for (let i = 0; i < channel.length; i++) this.mono[i] += channel[i] / channels.length;
      }
      mono = this.mono;
    }
    this.resampler.push(mono, this.emit);
    return true;
  }
}

registerProcessor("pcm16-capture", Pcm16Capture);
