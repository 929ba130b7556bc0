//! Which x86-64 vector extensions rlmesh's own CPU kernels use.
//!
//! The kernels ([`crate::kernels`], [`crate::fused`], the learner's AdamW) are
//! compiled for AVX-512, for AVX2 + FMA and for the build's baseline, and the
//! widest the CPU has is picked at run time. `RLMESH_CPU_ISA` caps that choice:
//! `avx2` or `baseline` runs, on this machine, the code another CPU class would
//! run. With libtorch's and MKL's own caps (`ATEN_CPU_CAPABILITY=avx2`,
//! `MKL_ENABLE_INSTRUCTIONS=AVX2`, `ONEDNN_MAX_CPU_ISA=AVX2`) a whole run takes an
//! AVX2-only CPU's code paths (docs/performance.md measures what that costs).
//! Unset, empty or `native`: no cap.
use std::sync::OnceLock;

/// The environment variable that caps the kernels' instruction set.
pub const ENV: &str = "RLMESH_CPU_ISA";

/// An instruction-set level of the kernels, narrowest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    /// The build's baseline (SSE2 on x86-64; any other architecture).
    Baseline,
    /// AVX2 with FMA.
    Avx2,
    /// AVX-512F (with AVX2 and FMA).
    Avx512,
}

impl Isa {
    /// Parses a cap as `RLMESH_CPU_ISA` spells it (`None`: no cap).
    pub fn parse_cap(text: &str) -> Result<Option<Isa>, String> {
        match text.trim().to_ascii_lowercase().as_str() {
            "" | "native" => Ok(None),
            "avx512" => Ok(Some(Isa::Avx512)),
            "avx2" => Ok(Some(Isa::Avx2)),
            "baseline" => Ok(Some(Isa::Baseline)),
            other => Err(format!("{ENV}={other:?}: expected one of native, avx512, avx2, baseline")),
        }
    }

    /// The widest level this CPU runs.
    pub fn detected() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            let fma = std::arch::is_x86_feature_detected!("fma");
            if fma && std::arch::is_x86_feature_detected!("avx512f") {
                return Isa::Avx512;
            }
            if fma && std::arch::is_x86_feature_detected!("avx2") {
                return Isa::Avx2;
            }
        }
        Isa::Baseline
    }
}

/// Checks `RLMESH_CPU_ISA`; the error names the variable and what it takes.
pub fn check_env() -> Result<(), String> {
    std::env::var(ENV).map_or(Ok(()), |v| Isa::parse_cap(&v).map(|_| ()))
}

/// The level the kernels use: the CPU's, capped by `RLMESH_CPU_ISA` (read once;
/// a value [`check_env`] refuses is ignored here, since a kernel cannot fail).
pub fn level() -> Isa {
    static LEVEL: OnceLock<Isa> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        let cap = std::env::var(ENV).ok().and_then(|v| Isa::parse_cap(&v).ok().flatten());
        cap.map_or(Isa::detected(), |c| c.min(Isa::detected()))
    })
}

/// Whether the AVX-512 kernels may run.
pub fn avx512() -> bool {
    level() >= Isa::Avx512
}

/// Whether the AVX2 + FMA kernels may run.
pub fn avx2_fma() -> bool {
    level() >= Isa::Avx2
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_parse_and_never_raise_the_level() {
        assert_eq!(Isa::parse_cap("").unwrap(), None);
        assert_eq!(Isa::parse_cap("native").unwrap(), None);
        assert_eq!(Isa::parse_cap(" AVX2 ").unwrap(), Some(Isa::Avx2));
        assert_eq!(Isa::parse_cap("baseline").unwrap(), Some(Isa::Baseline));
        let e = Isa::parse_cap("sse9").unwrap_err();
        assert!(e.contains("RLMESH_CPU_ISA") && e.contains("avx2"), "{e}");
        assert!(Isa::Baseline < Isa::Avx2 && Isa::Avx2 < Isa::Avx512);
        assert!(level() <= Isa::detected());
    }
}
