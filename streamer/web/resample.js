// Resampling to the server's 16 kHz (downsampling, in practice: microphones run at 44.1 or 48 kHz), used by the
// capture worklet (worklet.js).
//
// A windowed-sinc interpolator: each output sample is the input convolved with a low-pass kernel centred on the
// output's position in input samples. The cutoff sits at 90 % of the output Nyquist frequency (7.2 kHz for
// 16 kHz), so the speech band is kept and what would alias is attenuated; the Hann window over HALF_TAPS input
// samples each side keeps the cost at 2 * HALF_TAPS multiply-adds per output sample.

export const TARGET_RATE = 16000;
const HALF_TAPS = 16;
const CUTOFF = 0.9;

export class Resampler {
  /** @param {number} inputRate Hz; @param {number} outputRate Hz */
  constructor(inputRate, outputRate = TARGET_RATE) {
    if (!(inputRate > 0 && outputRate > 0)) throw new RangeError(`bad rates ${inputRate} -> ${outputRate}`);
    this.step = inputRate / outputRate; // input samples per output sample
    // the lower Nyquist frequency of the two, as a fraction of the input's (a Bluetooth headset may give 8 kHz)
    this.cutoff = CUTOFF * Math.min(1, outputRate / inputRate);
    this.buffer = new Float32Array(4096);
    this.length = 0; // valid samples in buffer
    this.position = HALF_TAPS - 1; // where the next output sample sits, in buffer samples
  }

  kernel(x) {
    if (Math.abs(x) >= HALF_TAPS) return 0;
    const window = 0.5 + 0.5 * Math.cos((Math.PI * x) / HALF_TAPS);
    if (x === 0) return this.cutoff;
    const arg = Math.PI * this.cutoff * x;
    return (this.cutoff * Math.sin(arg) * window) / arg;
  }

  /**
   * Feed input samples; call emit(sample) for every output sample they complete.
   * @param {Float32Array} input
   * @param {(sample: number) => void} emit
   */
  push(input, emit) {
    if (this.length + input.length > this.buffer.length) {
      const grown = new Float32Array(2 * (this.length + input.length));
      grown.set(this.buffer.subarray(0, this.length));
      this.buffer = grown;
    }
    this.buffer.set(input, this.length);
    this.length += input.length;
    const buffer = this.buffer;
    while (this.position + HALF_TAPS < this.length) {
      const centre = Math.floor(this.position);
      const frac = this.position - centre;
      let sum = 0;
      let norm = 0;
      for (let k = 1 - HALF_TAPS; k <= HALF_TAPS; k++) {
        const w = this.kernel(k - frac);
        sum += w * buffer[centre + k];
        norm += w;
      }
      emit(sum / norm); // norm: unit gain at DC whatever the fractional position
      this.position += this.step;
    }
    // keep only what the next output samples still need
    const drop = Math.floor(this.position) - HALF_TAPS + 1;
    if (drop > 0) {
      buffer.copyWithin(0, drop, this.length);
      this.length -= drop;
      this.position -= drop;
    }
  }
}

/** A float sample in [-1, 1] as a signed 16-bit integer, clipped. */
export function toPcm16(sample) {
  const s = Math.max(-1, Math.min(1, sample));
  return s < 0 ? Math.round(s * 32768) : Math.round(s * 32767);
}
