//! Topology-aware choice of whole units (GPUs, or MIG devices) for GetPreferredAllocation.
//!
//! Among the candidates, honouring the units the container already has (`must`), the chosen
//! set of the requested size is the best by, in this order:
//!
//! 1. all of its units (with `must`) on one NUMA node, when some set is;
//! 2. the highest total link score of the set: the sum over its pairs of
//!    [`Link::score`](crate::inventory::topology::Link::score) — NVLink count first (NVSwitch
//!    counts as all 18 links), then the PCIe level; two MIG devices of one GPU score highest;
//! 3. the best-connected remaining free units: the highest total link score among the
//!    candidates left over. Taking the orphan of a broken NVLink pair costs the rest nothing,
//!    breaking an intact pair costs them the pair, so the orphan goes first; for one unit, the
//!    one whose loss hurts the others least;
//! 4. the lowest positions (deterministic).
//!
//! The search is exact (every combination) while there are at most [`EXACT_LIMIT`] of them
//! (every request on 16 GPUs: C(16, 8) = 12,870); above that a greedy search from each of the
//! first [`GREEDY_SEEDS`] candidates bounds the work. Pure: the scores are precomputed with the
//! plan ([`UnitLinks`]), nothing here calls NVML.

use crate::plan::UnitLinks;

/// Most combinations searched exactly; larger requests use the bounded greedy search.
pub const EXACT_LIMIT: u64 = 20_000;

/// Seeds the greedy search starts from (each candidate up to this many).
pub const GREEDY_SEEDS: usize = 64;

/// How good a chosen set is; larger is better, compared field by field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct SetScore {
    /// Every unit of the set on one NUMA node.
    pub one_numa: bool,
    /// The set's total link score (its pairs, `must` included).
    pub links: u64,
    /// The total link score among the candidates left over, minus a constant (only compared).
    pub rest: i64,
}

/// `n` choose `k`, saturating at `u64::MAX`.
fn binomial(n: usize, k: usize) -> u64 {
    let k = k.min(n - k.min(n));
    let mut r: u64 = 1;
    for i in 0..k {
        r = match r.checked_mul((n - i) as u64) {
            Some(v) => v / (i as u64 + 1),
            None => return u64::MAX,
        };
    }
    r
}

/// What the search works on: candidates by local index.
struct Problem {
    n: usize,
    /// `n × n` link scores between candidates.
    w: Vec<u32>,
    /// Per candidate: its links to every `must` unit.
    to_must: Vec<u64>,
    /// Per candidate: its links to every other candidate.
    degree: Vec<u64>,
    /// Per candidate: NUMA node.
    numa: Vec<Option<i64>>,
    /// The NUMA node `must` is on: `None` = no `must`, `Some(None)` = mixed or unknown ones.
    must_numa: Option<Option<Option<i64>>>,
    /// Links among the `must` units.
    must_links: u64,
}

impl Problem {
    fn w(&self, a: usize, b: usize) -> u64 {
        u64::from(self.w[a * self.n + b])
    }
}

/// The partial set during the search.
#[derive(Clone, Copy)]
struct Partial {
    links: u64,
    degree: u64,
    inner: u64,
    /// `None` before the first unit; `Some(Some(n))` while all are on `n`; `Some(None)` mixed.
    numa: Option<Option<Option<i64>>>,
}

impl Partial {
    fn start(p: &Problem) -> Self {
        Partial {
            links: p.must_links,
            degree: 0,
            inner: 0,
            numa: p.must_numa,
        }
    }

    fn add(mut self, p: &Problem, chosen: &[usize], c: usize) -> Self {
        let inner: u64 = chosen.iter().map(|&x| p.w(x, c)).sum();
        self.inner += inner;
        self.links += inner + p.to_must[c];
        self.degree += p.degree[c];
        let n = p.numa[c];
        self.numa = Some(match self.numa {
            None => Some(n),
            Some(Some(cur)) if cur == n => Some(cur),
            Some(_) => None,
        });
        self
    }

    fn score(&self) -> SetScore {
        SetScore {
            one_numa: matches!(self.numa, Some(Some(_)) | None),
            links: self.links,
            // Links among the rest = all candidate links − Σ degree(chosen) + links among the
            // chosen; the constant is left out.
            rest: self.inner as i64 - self.degree as i64,
        }
    }
}

/// Chooses `k` of `candidates` (unit numbers of `links`, ascending by position) to go with
/// `must` (units the container has already). Returns the chosen candidates in candidate
/// order and the score of the whole set (`must` included). Fewer than `k` candidates: all of
/// them.
pub fn choose(
    links: &UnitLinks,
    must: &[usize],
    candidates: &[usize],
    k: usize,
) -> (Vec<usize>, SetScore) {
    let n = candidates.len();
    let k = k.min(n);
    let mut w = vec![0u32; n * n];
    let mut degree = vec![0u64; n];
    let mut to_must = vec![0u64; n];
    for (i, &a) in candidates.iter().enumerate() {
        for (j, &b) in candidates.iter().enumerate() {
            if i != j {
                let s = links.score(a, b);
                w[i * n + j] = s;
                degree[i] += u64::from(s);
            }
        }
        to_must[i] = must.iter().map(|&m| u64::from(links.score(a, m))).sum();
    }
    let mut must_links = 0u64;
    for (i, &a) in must.iter().enumerate() {
        for &b in &must[i + 1..] {
            must_links += u64::from(links.score(a, b));
        }
    }
    let must_numa = must.first().map(|&m0| {
        let n0 = links.numa(m0);
        must.iter().all(|&m| links.numa(m) == n0).then_some(n0)
    });
    let p = Problem {
        n,
        w,
        to_must,
        degree,
        numa: candidates.iter().map(|&c| links.numa(c)).collect(),
        must_numa,
        must_links,
    };
    let (local, score) = if binomial(n, k) <= EXACT_LIMIT {
        exact(&p, k)
    } else {
        greedy(&p, k, must.is_empty())
    };
    (local.into_iter().map(|i| candidates[i]).collect(), score)
}

/// Every combination, in lexicographic order; the first best wins.
fn exact(p: &Problem, k: usize) -> (Vec<usize>, SetScore) {
    let mut best: Option<(SetScore, Vec<usize>)> = None;
    let mut chosen = Vec::with_capacity(k);
    fn walk(
        p: &Problem,
        k: usize,
        from: usize,
        part: Partial,
        chosen: &mut Vec<usize>,
        best: &mut Option<(SetScore, Vec<usize>)>,
    ) {
        if chosen.len() == k {
            let s = part.score();
            if best.as_ref().is_none_or(|(b, _)| s > *b) {
                *best = Some((s, chosen.clone()));
            }
            return;
        }
        let left = k - chosen.len();
        for c in from..=p.n - left {
            let next = part.add(p, chosen, c);
            chosen.push(c);
            walk(p, k, c + 1, next, chosen, best);
            chosen.pop();
        }
    }
    walk(p, k, 0, Partial::start(p), &mut chosen, &mut best);
    let (s, set) = best.expect("k <= n, so at least one combination");
    (set, s)
}

/// Greedy growth: from each seed (or from `must` alone), add the candidate that keeps one
/// NUMA node, adds the most links (counting, while two or more units are still to come, its
/// best link to a free candidate, so pairs are taken whole), and takes the fewest links from
/// the rest.
fn greedy(p: &Problem, k: usize, seeded: bool) -> (Vec<usize>, SetScore) {
    let seeds: Vec<Option<usize>> = if seeded && k > 0 {
        (0..p.n.min(GREEDY_SEEDS)).map(Some).collect()
    } else {
        vec![None]
    };
    let mut best: Option<(SetScore, Vec<usize>)> = None;
    for seed in seeds {
        let mut chosen: Vec<usize> = Vec::with_capacity(k);
        let mut taken = vec![false; p.n];
        let mut part = Partial::start(p);
        if let Some(s) = seed {
            part = part.add(p, &chosen, s);
            chosen.push(s);
            taken[s] = true;
        }
        while chosen.len() < k {
            let mut pick: Option<(SetScore, usize, Partial)> = None;
            for c in (0..p.n).filter(|&c| !taken[c]) {
                let next = part.add(p, &chosen, c);
                let mut s = next.score();
                // Look one unit ahead while two or more are still to come: a GPU whose NVLink
                // partner is free is worth its pair, not only its links to the set so far.
                if chosen.len() + 2 <= k {
                    s.links += (0..p.n)
                        .filter(|&d| d != c && !taken[d])
                        .map(|d| p.w(c, d))
                        .max()
                        .unwrap_or(0);
                }
                if pick.as_ref().is_none_or(|(b, _, _)| s > *b) {
                    pick = Some((s, c, next));
                }
            }
            let (_, c, next) = pick.expect("fewer chosen than candidates");
            part = next;
            chosen.push(c);
            taken[c] = true;
        }
        chosen.sort_unstable();
        let s = part.score();
        if best.as_ref().is_none_or(|(b, _)| s > *b) {
            best = Some((s, chosen));
        }
    }
    let (s, set) = best.expect("at least one seed");
    (set, s)
}

#[cfg(test)]
mod tests {
    use super::{binomial, exact, greedy, Problem};

    /// A search problem from a symmetric weight matrix: candidates' NUMA nodes, and (when
    /// given) each candidate's links to one held unit on NUMA node 0.
    fn problem(w: &[&[u32]], numa: &[i64], to_must: Option<&[u64]>) -> Problem {
        let n = w.len();
        let flat: Vec<u32> = w.iter().flat_map(|r| r.iter().copied()).collect();
        let degree = (0..n)
            .map(|i| (0..n).filter(|&j| j != i).map(|j| u64::from(w[i][j])).sum())
            .collect();
        Problem {
            n,
            w: flat,
            to_must: to_must.map_or(vec![0; n], <[u64]>::to_vec),
            degree,
            numa: numa.iter().map(|&x| Some(x)).collect(),
            must_numa: to_must.map(|_| Some(Some(0))),
            must_links: 0,
        }
    }

    /// Found by searching random layouts: the greedy search finds the exact search's answer
    /// here (a mutant of its rule does not).
    #[test]
    fn greedy_seeds_from_every_candidate_when_nothing_is_held() {
        let p = problem(
            &[
                &[0, 1, 2, 8, 0, 0, 4],
                &[1, 0, 0, 1, 4, 0, 4],
                &[2, 0, 0, 1, 0, 0, 2],
                &[8, 1, 1, 0, 2, 0, 1],
                &[0, 4, 0, 2, 0, 0, 4],
                &[0, 0, 0, 0, 0, 0, 2],
                &[4, 4, 2, 1, 4, 2, 0],
            ],
            &[0, 1, 0, 0, 1, 1, 1],
            None,
        );
        assert_eq!(greedy(&p, 4, true).0, exact(&p, 4).0);
    }

    /// Found by searching random layouts: the greedy search finds the exact search's answer
    /// here (a mutant of its rule does not).
    #[test]
    fn greedy_looks_ahead_to_a_free_partner_only() {
        let p = problem(
            &[
                &[0, 2, 8, 1, 1, 0, 1, 8],
                &[2, 0, 1, 8, 2, 2, 2, 2],
                &[8, 1, 0, 1, 4, 1, 1, 1],
                &[1, 8, 1, 0, 0, 4, 8, 8],
                &[1, 2, 4, 0, 0, 4, 1, 4],
                &[0, 2, 1, 4, 4, 0, 8, 0],
                &[1, 2, 1, 8, 1, 8, 0, 1],
                &[8, 2, 1, 8, 4, 0, 1, 0],
            ],
            &[1, 0, 1, 0, 0, 0, 0, 1],
            Some(&[0, 1, 1, 4, 0, 1, 1, 1]),
        );
        assert_eq!(greedy(&p, 3, false).0, exact(&p, 3).0);
    }

    /// Found by searching random layouts: the greedy search finds the exact search's answer
    /// here (a mutant of its rule does not).
    #[test]
    fn greedy_takes_the_lowest_position_among_equal_picks() {
        let p = problem(
            &[
                &[0, 0, 1, 4, 1, 2],
                &[0, 0, 4, 1, 8, 0],
                &[1, 4, 0, 0, 8, 4],
                &[4, 1, 0, 0, 8, 4],
                &[1, 8, 8, 8, 0, 1],
                &[2, 0, 4, 4, 1, 0],
            ],
            &[0, 0, 0, 0, 0, 0],
            Some(&[1, 0, 4, 4, 4, 0]),
        );
        assert_eq!(greedy(&p, 2, false).0, exact(&p, 2).0);
    }

    /// Found by searching random layouts: the greedy search finds the exact search's answer
    /// here (a mutant of its rule does not).
    #[test]
    fn greedy_keeps_the_first_of_equal_seeds() {
        let p = problem(
            &[
                &[0, 8, 1, 1, 1],
                &[8, 0, 1, 8, 2],
                &[1, 1, 0, 0, 4],
                &[1, 8, 0, 0, 2],
                &[1, 2, 4, 2, 0],
            ],
            &[0, 0, 0, 0, 0],
            None,
        );
        assert_eq!(greedy(&p, 2, true).0, exact(&p, 2).0);
    }

    #[test]
    fn binomials() {
        assert_eq!(binomial(16, 8), 12_870);
        assert_eq!(binomial(8, 0), 1);
        assert_eq!(binomial(8, 8), 1);
        assert_eq!(binomial(3, 5), 1);
        assert_eq!(binomial(200, 100), u64::MAX);
    }
}
