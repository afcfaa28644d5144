//! Pirate Alg. 2: a flow's inter-packet gaps summarised by at most N modes, each the
//! (min, max, count, mean) of the gaps it holds, kept in ascending order and separated by more
//! than ε, or, with a span cap ([`Epsilon::span`]), adjacent pieces of one such mode. Stored as
//! parallel arrays so N modes cost 10·N bytes and loops stay verifier-friendly.

use super::grid;

/// Modes, stored in 10 bytes each: bounds as grid codes ([`grid`]), counts saturating at 65535
/// gaps per epoch, and the mean as its place between the bounds, in 1/65536ths of the width.
/// A mean costs two bytes where a sum costs four; it is updated with rounding that is random
/// (dithered by the gap's own bits), so it drifts by about width·√(n/12)/65536 over n gaps
/// instead of being biased.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Modes<const M: usize> {
    /// Grid codes of the shortest and longest gap of each mode.
    pub lo: [u16; M],
    pub hi: [u16; M],
    pub count: [u16; M],
    /// Marked gaps in the mode (inter-batch-gap candidates): after a non-full-size packet, or
    /// across which a TCP client's acknowledgement number advanced (`FLAG_MARK_ACKED`).
    pub candidates: [u16; M],
    /// Where the mean lies in [lo, hi + 1): lo + mean·(hi − lo + 1)/65536.
    pub mean: [u16; M],
    /// Initialised modes, `lo`-ascending in slots `0..len`.
    pub len: u8,
    pub _pad: u8,
    /// Gaps that found no mode and no free slot (saturating).
    pub discarded: u16,
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
        Modes { lo: [0; M], hi: [0; M], count: [0; M], candidates: [0; M], mean: [0; M], len: 0, _pad: 0, discarded: 0 }
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

    /// The shortest and longest gap of mode `i` (ns); 0 beyond the arrays.
    #[inline(always)]
    pub fn bounds(&self, i: usize) -> (u32, u32) {
        if i < M {
            (grid::decode(self.lo[i]), grid::decode(self.hi[i]))
        } else {
            (0, 0)
        }
    }

    /// The mean gap of mode `i`, in ns·2^16 (the precision the mean is kept at).
    #[inline(always)]
    pub fn mean_q16(&self, i: usize) -> u64 {
        if i >= M {
            return 0;
        }
        let (lo, hi) = self.bounds(i);
        ((lo as u64) << 16) + self.mean[i] as u64 * (hi - lo + 1) as u64
    }

    /// The mean gap of mode `i` in ns, rounded.
    #[inline(always)]
    pub fn mean_ns(&self, i: usize) -> u64 {
        (self.mean_q16(i) + (1 << 15)) >> 16
    }

    /// Sets mode `i`'s mean to `q16` (ns·2^16), within its bounds `(lo, hi)`, rounding up with
    /// probability equal to the fraction dropped (`dither` is uniform in 0..2^16): one division
    /// and one clamp, no other branch for the verifier to walk.
    #[inline(always)]
    fn set_mean(&mut self, i: usize, q16: u64, dither: u64, (lo, hi): (u32, u32)) {
        if i >= M {
            return;
        }
        let steps = (hi - lo) as u64 + 1;
        let off = q16.saturating_sub((lo as u64) << 16);
        let m = (off + ((dither * steps) >> 16)) / steps;
        self.mean[i] = if m > u16::MAX as u64 { u16::MAX } else { m as u16 };
    }

    /// Alg. 2: counts gap `g` (ns) into the modes, with at most `max_modes` (≤ M) of them.
    /// With a span cap, a full table merges two adjacent modes to make room (never two chains
    /// of them, see `merge_cheapest`), so it discards nothing; a single mode
    /// (`modes = 1`) widens as Alg. 2 does, and discards a gap near no mode, as published.
    /// Bounds are placed on the grid (the gap's nearest grid value), the mean takes `g` itself.
    pub fn insert(&mut self, g: u32, candidate: bool, eps: Epsilon, max_modes: u32) -> Placed {
        let code = grid::encode(g);
        let gap = Gap { code, at: grid::decode(code), ns: g, candidate };
        let cap = if (max_modes as usize) < M { max_modes as usize } else { M };
        if let Some(placed) = self.place(&gap, eps, cap) {
            return placed;
        }
        if eps.span == 0 {
            return self.discard();
        }
        // Room now: g joins the merged mode if that covers it, or opens its own.
        let placed = if self.used() >= 2 && self.merge_cheapest(eps) {
            self.place(&gap, eps, cap)
        } else {
            self.place(&gap, Epsilon { span: 0, ..eps }, cap)
        };
        placed.unwrap_or_else(|| self.discard())
    }

    fn discard(&mut self) -> Placed {
        self.discarded = self.discarded.saturating_add(1);
        Placed::Discarded
    }

    /// Counts the gap into the mode that takes it, or into a new one; `None` if it needs a new
    /// mode and `cap` modes exist.
    fn place(&mut self, gap: &Gap, eps: Epsilon, cap: usize) -> Option<Placed> {
        let len = self.used();
        let g = gap.at;
        // Ascending traversal: the first mode whose ε-widened range holds g (within the span
        // cap) takes it; else g belongs before the first mode that starts above it.
        let mut at = len;
        for i in 0..M {
            if i >= len {
                break;
            }
            let (lo, hi) = self.bounds(i);
            let joins = if g < lo {
                lo - g <= eps.at(g) && eps.spans(g, hi)
            } else if g > hi {
                // Not past the next mode's start: a capped mode's neighbour may lie within ε.
                let below_next = i + 1 >= len || i + 1 >= M || gap.code < self.lo[i + 1];
                g - hi <= eps.at(hi) && eps.spans(lo, g) && below_next
            } else {
                true
            };
            if joins {
                let before = ((lo as u64) << 16) + self.mean[i] as u64 * (hi - lo + 1) as u64;
                // Widening downwards cannot make mode i−1 mergeable: g was found not near it,
                // judged at the same lower value, or near it but beyond its span.
                if g < lo {
                    self.lo[i] = gap.code;
                    self.count_into(i, gap, before, (g, hi));
                } else if g > hi {
                    self.hi[i] = gap.code;
                    self.count_into(i, gap, before, (lo, g));
                    self.merge_if_close(i, eps);
                } else {
                    self.count_into(i, gap, before, (lo, hi));
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
        self.open_at(at, len, gap);
        Some(Placed::Opened)
    }

    /// Merges the two adjacent modes whose union costs the quantiles least: the square of its
    /// width in ε times the decades of tail it holds (about its gaps over the gaps at or above
    /// its middle). A quantile is placed within a mode to within its width, and squared, a
    /// union across a wide empty range (the break between gaps inside batches and the
    /// responses, which the estimators need apart, or the cliff to a tail) costs more than a
    /// few of the body's narrow pieces. The quantiles read (p50, p90, p99) lie evenly over
    /// decades of the tail, not evenly over gaps: the few slowest gaps of a flow hold its p99 as
    /// its dense modes hold p50, so a tail that stands apart from the body (requests that
    /// waited for a retransmission) keeps its own count. Two modes further apart than ε merge
    /// only if that does not join two chains (each chained to its other neighbour within ε):
    /// that would bridge two regimes into one chain, which the estimators read as one mode.
    /// Found by value, not by index: the verifier prunes states that differ in data it never
    /// branches on, not states that differ in a tracked index (2^M paths). Returns whether it
    /// merged; needs two modes.
    fn merge_cheapest(&mut self, eps: Epsilon) -> bool {
        let len = self.used();
        // Slots past `len` hold zeros: summed without a branch on `len`.
        let total: u64 = self.count.iter().map(|&n| n as u64).sum();
        // Of modes i and i + 1, above `below` gaps. The clamped width (2^20 ε) squared, gaps
        // below 2^17 and the scale keep the product within a u64 (no 128-bit multiply in BPF).
        let cost = |m: &Self, i: usize, below: u64| {
            let chained = |a: usize| eps.close(m.bounds(a).1, m.bounds(a + 1).0);
            let chained_below = i >= 1 && chained(i - 1);
            let chained_above = i + 2 < len && chained(i + 1);
            if !chained(i) && chained_below && chained_above {
                return u64::MAX;
            }
            let (lo, hi) = (m.bounds(i).0, m.bounds(i + 1).1);
            let gaps = m.count[i] as u64 + m.count[i + 1] as u64;
            // `below + gaps` never exceeds the total; saturating would branch on data, and each
            // such branch doubles the states the verifier walks.
            let above = total.wrapping_sub(below + gaps);
            let width_q4 = ((((hi - lo) as u64) << 4) / eps.at(lo).max(1) as u64).min(1 << 20);
            // Odd, so never zero, and within one of the gaps at or above the union's middle.
            ((gaps * width_q4 * width_q4) << 4) / ((above + gaps / 2) | 1)
        };
        // The cheapest union is named by its lower mode's `lo` (distinct per mode), a value
        // read from the map, so each cost is computed once.
        let mut best = cost(self, 0, 0);
        let mut best_lo = self.lo[0];
        let mut below = self.count[0] as u64;
        for i in 1..M - 1 {
            if i + 1 >= len {
                break;
            }
            let c = cost(self, i, below);
            if c < best {
                best = c;
                best_lo = self.lo[i];
            }
            below += self.count[i] as u64;
        }
        let mut merged = false;
        for i in 0..M - 1 {
            if i + 1 >= len {
                break;
            }
            if merged {
                self.copy_slot(i + 1, i);
            } else if best < u64::MAX && self.lo[i] == best_lo {
                self.absorb_next(i);
                merged = true;
            }
        }
        if merged {
            self.len = (len - 1) as u8;
            self.zero_slot(len - 1);
        }
        merged
    }

    /// Counts the gap into mode `i`, whose mean was `before` (ns·2^16) and whose bounds are now
    /// `bounds`, holding the gap.
    fn count_into(&mut self, i: usize, gap: &Gap, before: u64, bounds: (u32, u32)) {
        if i >= M {
            return;
        }
        // The running mean over n gaps. Means are below 2^48 and n ≤ 2^16: the product fits.
        let n = self.count[i] as u64 + 1;
        let after = (before * (n - 1) + ((gap.ns as u64) << 16)) / n;
        self.set_mean(i, after, dither(gap.ns as u64), bounds);
        self.count[i] = self.count[i].saturating_add(1);
        self.candidates[i] = self.candidates[i].saturating_add(gap.candidate as u16);
    }

    /// Shifts modes `at..len` up one slot and puts a singleton mode holding the gap at `at`.
    fn open_at(&mut self, at: usize, len: usize, gap: &Gap) {
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
        self.lo[at] = gap.code;
        self.hi[at] = gap.code;
        self.count[at] = 1;
        self.candidates[at] = gap.candidate as u16;
        self.mean[at] = 0;
        self.len = (len + 1) as u8;
    }

    /// ConsiderMergeModes(i, i+1): joins the two if they now lie within ε of each other (and
    /// their union within the span cap).
    fn merge_if_close(&mut self, i: usize, eps: Epsilon) {
        let len = self.used();
        let j = i + 1;
        if j >= len || j >= M {
            return;
        }
        let ((lo, hi), (next_lo, next_hi)) = (self.bounds(i), self.bounds(j));
        if !eps.close(hi, next_lo) || !eps.spans(lo, next_hi) {
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
        self.len = (len - 1) as u8;
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
        // Weighted at 2^-8 ns: means below 2^40 times counts below 2^16, summed, fit.
        let (a, b) = (self.mean_q16(i) >> 8, self.mean_q16(j) >> 8);
        let (na, nb) = (self.count[i] as u64, self.count[j] as u64);
        let mean = ((a * na + b * nb) / (na + nb).max(1)) << 8;
        if self.hi[j] > self.hi[i] {
            self.hi[i] = self.hi[j];
        }
        self.set_mean(i, mean, dither(mean), self.bounds(i));
        self.count[i] = self.count[i].saturating_add(self.count[j]);
        self.candidates[i] = self.candidates[i].saturating_add(self.candidates[j]);
    }

    fn copy_slot(&mut self, from: usize, to: usize) {
        if from >= M || to >= M {
            return;
        }
        self.lo[to] = self.lo[from];
        self.hi[to] = self.hi[from];
        self.count[to] = self.count[from];
        self.candidates[to] = self.candidates[from];
        self.mean[to] = self.mean[from];
    }

    fn zero_slot(&mut self, i: usize) {
        if i >= M {
            return;
        }
        self.lo[i] = 0;
        self.hi[i] = 0;
        self.count[i] = 0;
        self.candidates[i] = 0;
        self.mean[i] = 0;
    }
}

/// A gap being placed: its grid code and value (for the bounds), and its exact length (for the
/// mean).
struct Gap {
    code: u16,
    at: u32,
    ns: u32,
    candidate: bool,
}

/// 16 pseudo-random bits from `x` (a Fibonacci hash): the rounding dither for means. Taken from
/// the data, so that the kernel and replay round alike.
#[inline(always)]
fn dither(x: u64) -> u64 {
    x.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 48
}
