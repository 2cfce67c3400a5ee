//! The median the engine benches report (`flush_cpu`, `readahead`).

/// The median of `v` (the upper one of an even count; NaN when empty).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}
