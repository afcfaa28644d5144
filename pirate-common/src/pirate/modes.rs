//! Pirate Alg. 2: a flow's inter-packet gaps summarised by at most N modes, each the
//! (min, max, count, sum) of the gaps it holds, kept in ascending order and separated by more
//! than ε, or, with a span cap ([`Epsilon::span`]), adjacent pieces of one such mode. Stored as
//! parallel arrays so N modes cost 20·N bytes and loops stay verifier-friendly.

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
/// merging consistent.
///
/// Beyond the paper, `span` caps how wide a mode may grow: at most `span`·ε at its lower end,
/// unless the table is full (see [`Modes::insert`]). Alg. 2 lets a mode chain along its own
/// jitter, and a mode's min/max/count/sum cannot say where in it the slowest 1 % lie. Capped,
/// the same gaps fill adjacent narrow modes ("pieces") whose counts place the tail; a chain of
/// pieces closer than ε is exactly what Alg. 2 would have made of them, so estimators that want
/// Alg. 2's modes read the chains. 0: unbounded, as published.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Epsilon {
    pub abs_ns: u32,
    /// ε grows by `rel_q20 / 2^20` of the gap.
    pub rel_q20: u32,
    /// The widest a mode grows, in ε at its lower end (0: unbounded).
    pub span: u32,
}

impl Epsilon {
    pub const fn fixed(abs_ns: u32) -> Epsilon {
        Epsilon { abs_ns, rel_q20: 0, span: 0 }
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

    /// Whether b (≥ a) lies within ε of a.
    #[inline(always)]
    pub fn close(&self, a: u32, b: u32) -> bool {
        b.saturating_sub(a) <= self.at(a)
    }

    /// Whether a mode may span [lo, hi].
    #[inline(always)]
    pub fn spans(&self, lo: u32, hi: u32) -> bool {
        self.span == 0 || hi.saturating_sub(lo) as u64 <= self.span as u64 * self.at(lo) as u64
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
    /// With a span cap, a full table merges two adjacent modes to make room (never two chains
    /// of them, see `merge_cheapest`), so it discards nothing; a single mode
    /// (`modes = 1`) widens as Alg. 2 does, and discards a gap near no mode, as published.
    pub fn insert(&mut self, g: u32, candidate: bool, eps: Epsilon, max_modes: u32) -> Placed {
        let cap = if (max_modes as usize) < M { max_modes as usize } else { M };
        if let Some(placed) = self.place(g, candidate, eps, cap) {
            return placed;
        }
        if eps.span == 0 {
            return self.discard();
        }
        // Room now: g joins the merged mode if that covers it, or opens its own.
        let placed = if self.used() >= 2 && self.merge_cheapest(eps) {
            self.place(g, candidate, eps, cap)
        } else {
            self.place(g, candidate, Epsilon { span: 0, ..eps }, cap)
        };
        placed.unwrap_or_else(|| self.discard())
    }

    fn discard(&mut self) -> Placed {
        self.discarded = self.discarded.saturating_add(1);
        Placed::Discarded
    }

    /// Counts g into the mode that takes it, or into a new one; `None` if it needs a new mode
    /// and `cap` modes exist.
    fn place(&mut self, g: u32, candidate: bool, eps: Epsilon, cap: usize) -> Option<Placed> {
        let len = self.used();
        // Ascending traversal: the first mode whose ε-widened range holds g (within the span
        // cap) takes it; else g belongs before the first mode that starts above it.
        let mut at = len;
        for i in 0..M {
            if i >= len {
                break;
            }
            let lo = self.min[i];
            let hi = self.max[i];
            let joins = if g < lo {
                lo - g <= eps.at(g) && eps.spans(g, hi)
            } else if g > hi {
                // Not past the next mode's start: a capped mode's neighbour may lie within ε.
                let below_next = i + 1 >= len || i + 1 >= M || g < self.min[i + 1];
                g - hi <= eps.at(hi) && eps.spans(lo, g) && below_next
            } else {
                true
            };
            if joins {
                self.count_into(i, g, candidate);
                // Widening downwards cannot make mode i−1 mergeable: g was found not near it,
                // judged at the same lower value, or near it but beyond its span.
                if g < lo {
                    self.min[i] = g;
                } else if g > hi {
                    self.max[i] = g;
                    self.merge_if_close(i, eps);
                }
                return Some(Placed::Joined);
            }
            if g < lo {
                at = i;
                break;
            }
        }
        if len >= cap {
            return None;
        }
        self.open_at(at, len, g, candidate);
        Some(Placed::Opened)
    }

    /// Merges the two adjacent modes whose union costs the quantiles least: its width in ε
    /// times the gaps it holds (a quantile falls in a mode in proportion to its gaps, and is
    /// placed within it to within its width): sparse tail modes merge with each other rather
    /// than a dense mode widening over them, which would hide the tail, as discarding gaps would
    /// lose it. Two modes further apart than ε merge only if that does not join two chains (each
    /// chained to its other neighbour within ε): that would bridge two regimes into one chain,
    /// which the estimators read as one mode. Found by value, not by index: the verifier prunes
    /// states that differ in data it never branches on, not states that differ in a tracked
    /// index (2^M paths). Returns whether it merged; needs two modes.
    fn merge_cheapest(&mut self, eps: Epsilon) -> bool {
        let len = self.used();
        // Saturated factors keep the product within a u64 (no 128-bit multiply in BPF).
        let cost = |m: &Self, i: usize| {
            let chained_below = i >= 1 && eps.close(m.max[i - 1], m.min[i]);
            let chained_above = i + 2 < len && i + 2 < M && eps.close(m.max[i + 1], m.min[i + 2]);
            if !eps.close(m.max[i], m.min[i + 1]) && chained_below && chained_above {
                return u64::MAX;
            }
            let gaps = (m.count[i] as u64 + m.count[i + 1] as u64).min(1 << 24);
            let width_q8 = (((m.max[i + 1] - m.min[i]) as u64) << 8) / eps.at(m.min[i]).max(1) as u64;
            gaps * width_q8.min(1 << 40)
        };
        let mut best = cost(self, 0);
        for i in 1..M - 1 {
            if i + 1 >= len {
                break;
            }
            let c = cost(self, i);
            if c < best {
                best = c;
            }
        }
        let mut merged = false;
        for i in 0..M - 1 {
            if i + 1 >= len {
                break;
            }
            if merged {
                self.copy_slot(i + 1, i);
            } else if best < u64::MAX && cost(self, i) == best {
                self.absorb_next(i);
                merged = true;
            }
        }
        if merged {
            self.len = (len - 1) as u32;
            self.zero_slot(len - 1);
        }
        merged
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

    /// ConsiderMergeModes(i, i+1): joins the two if they now lie within ε of each other (and
    /// their union within the span cap).
    fn merge_if_close(&mut self, i: usize, eps: Epsilon) {
        let len = self.used();
        let j = i + 1;
        if j >= len || j >= M {
            return;
        }
        if !eps.close(self.max[i], self.min[j]) || !eps.spans(self.min[i], self.max[j]) {
            return;
        }
        self.merge_pair(i, len);
    }

    /// Joins modes i and i + 1 of `len` into slot i.
    fn merge_pair(&mut self, i: usize, len: usize) {
        let j = i + 1;
        if j >= len || j >= M {
            return;
        }
        self.absorb_next(i);
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

    /// Adds mode i + 1's gaps to mode i (the caller removes slot i + 1).
    fn absorb_next(&mut self, i: usize) {
        let j = i + 1;
        if j >= M {
            return;
        }
        if self.max[j] > self.max[i] {
            self.max[i] = self.max[j];
        }
        self.count[i] = self.count[i].saturating_add(self.count[j]);
        self.candidates[i] = self.candidates[i].saturating_add(self.candidates[j]);
        self.sum[i] = self.sum[i].saturating_add(self.sum[j]);
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
