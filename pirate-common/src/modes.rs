//! Pirate Alg. 2: a flow's inter-packet gaps summarised by at most N modes, each the
//! (min, max, count, sum) of the gaps it holds, kept in ascending order and separated by more
//! than ε. Stored as parallel arrays so N modes cost 20·N bytes and loops stay verifier-friendly.

/// Sums are kept in units of 2^SUM_SHIFT ns (rounded) so a `u32` holds 68 s of gaps per epoch:
/// an epoch (≤ 60 s) plus one saturated idle gap. The rounding error is ±8 ns per gap, zero-mean.
pub const SUM_SHIFT: u32 = 4;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Modes<const M: usize> {
    pub min: [u32; M],
    pub max: [u32; M],
    pub count: [u32; M],
    /// Marked gaps in the mode (inter-batch-gap candidates): after a non-full-size packet, or
    /// across which a TCP client's acknowledgement number advanced (`FLAG_MARK_ACKED`).
    pub candidates: [u32; M],
    /// Sum of the gaps, in 2^SUM_SHIFT ns units.
    pub sum: [u32; M],
    /// Initialised modes, `min`-ascending in slots `0..len`.
    pub len: u32,
    /// Gaps that found no mode and no free slot.
    pub discarded: u32,
}

/// Alg. 2's closeness threshold: a fixed part and a part relative to the gap (Q20 fixed point),
/// so that a mode at 20 ms absorbs the jitter of its gaps as one at 200 µs does. Two values
/// a ≤ b are close when b − a ≤ ε(a): judged at the lower value, which keeps insertion and
/// merging consistent (adjacent modes always stay more than ε apart).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Epsilon {
    pub abs_ns: u32,
    /// ε grows by `rel_q20 / 2^20` of the gap.
    pub rel_q20: u32,
}

impl Epsilon {
    pub const fn fixed(abs_ns: u32) -> Epsilon {
        Epsilon { abs_ns, rel_q20: 0 }
    }

    #[inline(always)]
    pub fn at(&self, value: u32) -> u32 {
        let rel = ((value as u64 * self.rel_q20 as u64) >> 20) as u32;
        if rel > self.abs_ns {
            rel
        } else {
            self.abs_ns
        }
    }
}

/// What happened to one gap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placed {
    /// Counted into an existing mode (possibly widening or merging it).
    Joined,
    /// Started a new mode.
    Opened,
    /// No room: counted in `discarded`.
    Discarded,
}

impl<const M: usize> Default for Modes<M> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const M: usize> Modes<M> {
    pub const fn new() -> Self {
        Modes { min: [0; M], max: [0; M], count: [0; M], candidates: [0; M], sum: [0; M], len: 0, discarded: 0 }
    }

    pub fn clear(&mut self) {
        *self = Self::new();
    }

    /// Initialised modes, never more than the arrays hold (the bound the verifier needs).
    #[inline(always)]
    pub fn used(&self) -> usize {
        if (self.len as usize) < M {
            self.len as usize
        } else {
            M
        }
    }

    /// Sum of mode `i` in nanoseconds.
    pub fn sum_ns(&self, i: usize) -> u64 {
        (self.sum[i] as u64) << SUM_SHIFT
    }

    /// Alg. 2: counts gap `g` (ns) into the modes, with at most `max_modes` (≤ M) of them.
    pub fn insert(&mut self, g: u32, candidate: bool, eps: Epsilon, max_modes: u32) -> Placed {
        let len = self.used();
        // Ascending traversal: the first mode whose ε-widened range holds g takes it; else g
        // belongs before the first mode that starts more than ε above it.
        let mut at = len;
        for i in 0..M {
            if i >= len {
                break;
            }
            let lo = self.min[i];
            let hi = self.max[i];
            let near = if g < lo {
                lo - g <= eps.at(g)
            } else if g > hi {
                g - hi <= eps.at(hi)
            } else {
                true
            };
            if near {
                self.count_into(i, g, candidate);
                // Widening downwards cannot bring mode i−1 within ε: g was found not near it,
                // judged at the same lower value.
                if g < lo {
                    self.min[i] = g;
                } else if g > hi {
                    self.max[i] = g;
                    self.merge_if_close(i, eps);
                }
                return Placed::Joined;
            }
            if g < lo {
                at = i;
                break;
            }
        }
        let cap = if (max_modes as usize) < M { max_modes as usize } else { M };
        if len >= cap {
            self.discarded = self.discarded.saturating_add(1);
            return Placed::Discarded;
        }
        self.open_at(at, len, g, candidate);
        Placed::Opened
    }

    fn count_into(&mut self, i: usize, g: u32, candidate: bool) {
        if i >= M {
            return;
        }
        self.count[i] = self.count[i].saturating_add(1);
        self.candidates[i] = self.candidates[i].saturating_add(candidate as u32);
        let units = (g as u64 + (1 << (SUM_SHIFT - 1))) >> SUM_SHIFT;
        self.sum[i] = self.sum[i].saturating_add(units as u32);
    }

    /// Shifts modes `at..len` up one slot and puts a singleton mode holding `g` at `at`.
    fn open_at(&mut self, at: usize, len: usize, g: u32, candidate: bool) {
        // Walk down from the top so each slot is copied before it is overwritten.
        for k in 0..M {
            let j = M - 1 - k;
            if j <= at {
                break;
            }
            if j <= len {
                self.copy_slot(j - 1, j);
            }
        }
        if at >= M {
            return;
        }
        self.min[at] = g;
        self.max[at] = g;
        self.count[at] = 0;
        self.candidates[at] = 0;
        self.sum[at] = 0;
        self.count_into(at, g, candidate);
        self.len = (len + 1) as u32;
    }

    /// ConsiderMergeModes(i, i+1): joins the two if they now lie within ε of each other.
    fn merge_if_close(&mut self, i: usize, eps: Epsilon) {
        let len = self.len as usize;
        let j = i + 1;
        if j >= len || j >= M {
            return;
        }
        if self.min[j].saturating_sub(self.max[i]) > eps.at(self.max[i]) {
            return;
        }
        if self.max[j] > self.max[i] {
            self.max[i] = self.max[j];
        }
        self.count[i] = self.count[i].saturating_add(self.count[j]);
        self.candidates[i] = self.candidates[i].saturating_add(self.candidates[j]);
        self.sum[i] = self.sum[i].saturating_add(self.sum[j]);
        for s in 0..M {
            let from = s + 1;
            if s < j {
                continue;
            }
            if from >= len || from >= M {
                break;
            }
            self.copy_slot(from, s);
        }
        self.len = (len - 1) as u32;
        if len - 1 < M {
            self.zero_slot(len - 1);
        }
    }

    fn copy_slot(&mut self, from: usize, to: usize) {
        if from >= M || to >= M {
            return;
        }
        self.min[to] = self.min[from];
        self.max[to] = self.max[from];
        self.count[to] = self.count[from];
        self.candidates[to] = self.candidates[from];
        self.sum[to] = self.sum[from];
    }

    fn zero_slot(&mut self, i: usize) {
        if i >= M {
            return;
        }
        self.min[i] = 0;
        self.max[i] = 0;
        self.count[i] = 0;
        self.candidates[i] = 0;
        self.sum[i] = 0;
    }
}
