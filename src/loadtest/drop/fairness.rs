//! How fair a drop's admission was, as numbers: Kendall's τ between two orders of the same
//! shoppers (FIFO: arrival against admission, expected 1, no pair out of order), and a chi-square test of
//! independence between two orders cut into quantiles (a lottery: admission rank against
//! join time, expected independent), with its p-value.

use serde::Serialize;

/// How two orders of the same items agree, pair by pair.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Concordance {
    /// Kendall's τ-b: +1 when both put every pair in the same order, −1 when in the
    /// opposite order, about 0 when unrelated. Pairs tied in either (shoppers let in by
    /// one script share its millisecond) count as neither, and pull τ-b a little below 1.
    pub tau_b: f64,
    /// Pairs the two orders put the other way round, of all pairs.
    pub discordant_pairs: u64,
    pub pairs: u64,
}

/// Kendall's τ-b of paired observations, and the pairs out of order. `None` with fewer
/// than two pairs or when one side is all ties.
pub fn kendall(x: &[f64], y: &[f64]) -> Option<Concordance> {
    assert_eq!(x.len(), y.len(), "paired observations");
    let (mut concordant, mut discordant) = (0i64, 0i64);
    let (mut untied_x, mut untied_y) = (0i64, 0i64);
    for i in 0..x.len() {
        for j in i + 1..x.len() {
            let sign = |a: f64, b: f64| (a - b).signum() as i64 * i64::from(a != b);
            let (dx, dy) = (sign(x[i], x[j]), sign(y[i], y[j]));
            untied_x += dx.abs();
            untied_y += dy.abs();
            match dx * dy {
                1 => concordant += 1,
                -1 => discordant += 1,
                _ => {}
            }
        }
    }
    let denominator = ((untied_x as f64) * (untied_y as f64)).sqrt();
    let n = x.len() as u64;
    (denominator > 0.0).then(|| Concordance {
        tau_b: (concordant - discordant) as f64 / denominator,
        discordant_pairs: discordant as u64,
        pairs: n * n.saturating_sub(1) / 2,
    })
}

/// A chi-square test of independence between two orders of the same items.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Independence {
    /// Items in the test.
    pub n: usize,
    /// Quantiles each order is cut into (10, deciles, when every cell can expect at
    /// least 5 items; fewer otherwise).
    pub bins: usize,
    pub chi_square: f64,
    pub degrees_of_freedom: usize,
    /// The chance of a statistic at least this large if the two orders are unrelated: a
    /// fair lottery gives p spread evenly over 0–1; an order kept by join time gives p ≈ 0.
    pub p_value: f64,
}

/// Tests whether ranks `a` and `b` (each a permutation of `0..n`) are independent: each
/// is cut into `bins` equal quantiles, and the bins × bins table of counts is compared
/// with the `n / bins²` each cell expects. `None` when too few items for two bins.
pub fn independence(a: &[usize], b: &[usize]) -> Option<Independence> {
    assert_eq!(a.len(), b.len(), "paired ranks");
    let n = a.len();
    let bins = ((n as f64 / 5.0).sqrt().floor() as usize).min(10);
    if bins < 2 {
        return None;
    }
    let mut cells = vec![0f64; bins * bins];
    for (&ra, &rb) in a.iter().zip(b) {
        cells[(ra * bins / n) * bins + rb * bins / n] += 1.0;
    }
    // Margins: each quantile holds n / bins items, give or take one.
    let margin = |i: usize| ((i + 1) * n).div_ceil(bins) - (i * n).div_ceil(bins);
    let mut chi_square = 0.0;
    for i in 0..bins {
        for j in 0..bins {
            let expected = (margin(i) * margin(j)) as f64 / n as f64;
            chi_square += (cells[i * bins + j] - expected).powi(2) / expected;
        }
    }
    let degrees_of_freedom = (bins - 1) * (bins - 1);
    Some(Independence {
        n,
        bins,
        chi_square,
        degrees_of_freedom,
        p_value: chi_square_survival(chi_square, degrees_of_freedom as f64),
    })
}

/// Ranks 0..n of `values` (ties in the order given).
pub fn ranks(values: &[f64]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by(|&i, &j| values[i].total_cmp(&values[j]));
    let mut ranks = vec![0; values.len()];
    for (rank, i) in order.into_iter().enumerate() {
        ranks[i] = rank;
    }
    ranks
}

/// P(X ≥ x) for X chi-square distributed with `k` degrees of freedom: the regularised
/// upper incomplete gamma function Q(k/2, x/2).
pub fn chi_square_survival(x: f64, k: f64) -> f64 {
    if x <= 0.0 {
        return 1.0;
    }
    upper_gamma_q(k / 2.0, x / 2.0)
}

/// Q(a, x), by its series when x < a + 1 and its continued fraction otherwise (Numerical
/// Recipes, 6.2): both converge fast there, to ~1e-14.
fn upper_gamma_q(a: f64, x: f64) -> f64 {
    let log_prefix = a * x.ln() - x - ln_gamma(a);
    if x < a + 1.0 {
        let (mut term, mut sum, mut ap) = (1.0 / a, 1.0 / a, a);
        for _ in 0..1000 {
            ap += 1.0;
            term *= x / ap;
            sum += term;
            if term.abs() < sum.abs() * 1e-15 {
                break;
            }
        }
        (1.0 - sum * log_prefix.exp()).clamp(0.0, 1.0)
    } else {
        // Modified Lentz's method.
        let tiny = 1e-300;
        let mut b = x + 1.0 - a;
        let mut c = 1.0 / tiny;
        let mut d = 1.0 / b;
        let mut h = d;
        for i in 1..1000 {
            let an = -(i as f64) * (i as f64 - a);
            b += 2.0;
            d = an * d + b;
            d = if d.abs() < tiny { tiny } else { d };
            c = b + an / c;
            c = if c.abs() < tiny { tiny } else { c };
            d = 1.0 / d;
            let delta = d * c;
            h *= delta;
            if (delta - 1.0).abs() < 1e-15 {
                break;
            }
        }
        (log_prefix.exp() * h).clamp(0.0, 1.0)
    }
}

/// ln Γ(z) for z > 0 (Lanczos, g = 7, nine coefficients: ~1e-15 relative).
fn ln_gamma(z: f64) -> f64 {
    const G: f64 = 7.0;
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if z < 0.5 {
        // Reflection: Γ(z) Γ(1 − z) = π / sin(πz).
        return (std::f64::consts::PI / (std::f64::consts::PI * z).sin()).ln() - ln_gamma(1.0 - z);
    }
    let z = z - 1.0;
    let mut sum = C[0];
    for (i, c) in C.iter().enumerate().skip(1) {
        sum += c / (z + i as f64);
    }
    let t = z + G + 0.5;
    0.5 * (2.0 * std::f64::consts::PI).ln() + (z + 0.5) * t.ln() - t + sum.ln()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng as _;
    use rand::seq::SliceRandom as _;

    fn close(a: f64, b: f64, tolerance: f64) -> bool {
        (a - b).abs() <= tolerance * b.abs().max(1e-300)
    }

    #[test]
    fn chi_square_tail_matches_the_closed_forms() {
        // Two degrees of freedom: e^(−x/2); four: e^(−x/2) (1 + x/2).
        for x in [0.1, 1.0, 3.0, 10.0, 40.0] {
            let two = chi_square_survival(x, 2.0);
            assert!(close(two, (-x / 2.0f64).exp(), 1e-10), "k=2 x={x}: {two}");
            let four = chi_square_survival(x, 4.0);
            let want = (-x / 2.0f64).exp() * (1.0 + x / 2.0);
            assert!(close(four, want, 1e-10), "k=4 x={x}: {four}");
        }
        // One degree of freedom at its 5 % and 1 % critical values.
        assert!(close(
            chi_square_survival(3.841_458_820_694_124, 1.0),
            0.05,
            1e-9
        ));
        assert!(close(
            chi_square_survival(6.634_896_601_021_213, 1.0),
            0.01,
            1e-9
        ));
        // 81 degrees of freedom (deciles): the median is near 80.3; 185 is far out.
        let median = chi_square_survival(80.334, 81.0);
        assert!((median - 0.5).abs() < 0.002, "{median}");
        assert!(chi_square_survival(185.0, 81.0) < 1e-9);
        assert_eq!(chi_square_survival(0.0, 81.0), 1.0);
    }

    #[test]
    fn kendall_is_one_for_the_same_order_minus_one_reversed_and_counts_pairs_out_of_order() {
        let x: Vec<f64> = (0..50).map(f64::from).collect();
        let reversed: Vec<f64> = x.iter().rev().copied().collect();
        let same = kendall(&x, &x).unwrap();
        assert_eq!(
            (same.tau_b, same.discordant_pairs, same.pairs),
            (1.0, 0, 1225)
        );
        let back = kendall(&x, &reversed).unwrap();
        assert_eq!((back.tau_b, back.discordant_pairs), (-1.0, 1225));
        // Admitted five at a time, in arrival order: ties, no pair out of order, and τ-b
        // the square root of the untied share: 1 − 10·C(5,2)/C(50,2) = 1125/1225.
        let batches: Vec<f64> = x.iter().map(|v| (v / 5.0).floor()).collect();
        let batched = kendall(&x, &batches).unwrap();
        assert_eq!(batched.discordant_pairs, 0);
        assert!((batched.tau_b - (1125.0f64 / 1225.0).sqrt()).abs() < 1e-12);
        // One pair swapped.
        let mut swapped = x.clone();
        swapped.swap(10, 11);
        assert_eq!(kendall(&x, &swapped).unwrap().discordant_pairs, 1);
        assert_eq!(kendall(&x, &[1.0; 50]), None);
    }

    #[test]
    fn a_shuffle_passes_the_independence_test_and_a_kept_order_fails_it() {
        let n = 1000;
        let joined: Vec<usize> = (0..n).collect();
        let mut shuffled = joined.clone();
        shuffled.shuffle(&mut rand::rngs::StdRng::seed_from_u64(7));
        let fair = independence(&joined, &shuffled).unwrap();
        assert_eq!((fair.bins, fair.degrees_of_freedom), (10, 81));
        assert!(fair.p_value > 0.001, "{fair:?}");
        let tau = kendall(
            &joined.iter().map(|&v| v as f64).collect::<Vec<_>>(),
            &shuffled.iter().map(|&v| v as f64).collect::<Vec<_>>(),
        )
        .unwrap()
        .tau_b;
        assert!(tau.abs() < 0.1, "{tau}");
        let kept = independence(&joined, &joined).unwrap();
        assert!(kept.p_value < 1e-12, "{kept:?}");
        // Fewer items, fewer bins: 100 give 4 × 4 cells of 6.25.
        assert_eq!(
            independence(&joined[..100], &joined[..100]).unwrap().bins,
            4
        );
        assert_eq!(independence(&joined[..19], &joined[..19]), None);
    }

    #[test]
    fn ranks_order_values_from_zero() {
        assert_eq!(ranks(&[30.0, 10.0, 20.0]), vec![2, 0, 1]);
    }
}
