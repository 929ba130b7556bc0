//! Range checks shared by the recipe's sections: each error names its field.
use super::source::Invalid;

pub(super) fn unit(field: &str, v: f64) -> Result<(), Invalid> {
    if (0.0..=1.0).contains(&v) {
        Ok(())
    } else {
        Err(Invalid::new(field, format!("must be in [0, 1], got {v}")))
    }
}

pub(super) fn positive(field: &str, v: f64) -> Result<(), Invalid> {
    if v > 0.0 && v.is_finite() {
        Ok(())
    } else {
        Err(Invalid::new(field, format!("must be > 0, got {v}")))
    }
}

pub(super) fn at_most(field: &str, v: f64, max: f64, why: &str) -> Result<(), Invalid> {
    if v <= max {
        Ok(())
    } else {
        Err(Invalid::new(field, format!("must be at most {max} ({why}), got {v}")))
    }
}

pub(super) fn at_least(field: &str, v: f64, min: f64) -> Result<(), Invalid> {
    if v >= min {
        Ok(())
    } else {
        Err(Invalid::new(field, format!("must be at least {min}, got {v}")))
    }
}
