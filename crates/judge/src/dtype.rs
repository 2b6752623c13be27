//! What a dtype name means for comparing values: is it a float, and how
//! coarse is its rounding.

/// The kind of values a dtype holds, as far as comparison cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Floating point (complex included: stats are of the magnitude).
    Float,
    /// Integers: exact, so any difference is real.
    Int,
    /// `bool`: exact.
    Bool,
    /// Unknown name: treated like an exact type.
    Other,
}

/// A dtype of a dump, with what comparison needs to know about it.
#[derive(Clone, Debug, PartialEq)]
pub struct DType {
    /// As in the dump, e.g. `float32`. Shared: comparisons copy the compute
    /// dtype of every op pair.
    pub name: std::sync::Arc<str>,
    /// Float, integer, bool or unknown.
    pub kind: Kind,
    /// Unit roundoff (half an ulp at 1.0) for floats, 0 for exact types.
    pub unit_roundoff: f64,
}

impl DType {
    /// The dtype of a name as a dump writes it (`float32`, `torch.bfloat16`, `bf16`).
    pub fn parse(name: &str) -> DType {
        let canon = canonical(name);
        let (kind, u) = match canon {
            "float64" | "complex128" => (Kind::Float, f64::EPSILON / 2.0),
            "float32" | "complex64" => (Kind::Float, (f32::EPSILON / 2.0) as f64),
            "float16" | "complex32" => (Kind::Float, 2f64.powi(-11)),
            "bfloat16" => (Kind::Float, 2f64.powi(-8)),
            "float8_e4m3fn" | "float8_e4m3fnuz" => (Kind::Float, 2f64.powi(-4)),
            "float8_e5m2" | "float8_e5m2fnuz" | "float8_e8m0fnu" => (Kind::Float, 2f64.powi(-3)),
            "bool" => (Kind::Bool, 0.0),
            s if s.starts_with("int") || s.starts_with("uint") => (Kind::Int, 0.0),
            s if s.starts_with("float") => (Kind::Float, 2f64.powi(-3)),
            _ => (Kind::Other, 0.0),
        };
        DType {
            name: name.into(),
            kind,
            unit_roundoff: u,
        }
    }

    /// Whether torch has a dtype of this name (after aliases); `--rtol`
    /// accepts only these.
    pub fn is_known(name: &str) -> bool {
        const FLOATS: [&str; 11] = [
            "float64",
            "float32",
            "float16",
            "bfloat16",
            "complex32",
            "complex64",
            "complex128",
            "float8_e4m3fn",
            "float8_e4m3fnuz",
            "float8_e5m2",
            "float8_e5m2fnuz",
        ];
        const EXACT: [&str; 9] = [
            "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
        ];
        let c = canonical(name);
        FLOATS.contains(&c) || EXACT.contains(&c)
    }

    /// Whether it is a floating-point dtype.
    pub fn is_float(&self) -> bool {
        self.kind == Kind::Float
    }

    /// Integer or bool: values that do not round.
    pub fn is_discrete(&self) -> bool {
        matches!(self.kind, Kind::Int | Kind::Bool)
    }

    /// torch's name of the dtype (`bfloat16` for `bf16`).
    pub fn canonical(&self) -> &str {
        canonical(&self.name)
    }
}

/// The dtype name without a `torch.` prefix, with common aliases resolved,
/// so `--rtol bf16=...` and a dump's `bfloat16` meet.
pub fn canonical(name: &str) -> &str {
    let s = name.strip_prefix("torch.").unwrap_or(name);
    match s {
        "float" | "fp32" | "f32" => "float32",
        "double" | "fp64" | "f64" => "float64",
        "half" | "fp16" | "f16" => "float16",
        "bf16" => "bfloat16",
        "cfloat" => "complex64",
        "cdouble" => "complex128",
        "long" => "int64",
        "int" => "int32",
        "short" => "int16",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn precision_order() {
        let u = |n| DType::parse(n).unit_roundoff;
        assert!(u("bfloat16") > u("float16"));
        assert!(u("float16") > u("float32"));
        assert!(u("float32") > u("float64"));
        assert_eq!(u("int64"), 0.0);
        assert_eq!(DType::parse("torch.bfloat16").canonical(), "bfloat16");
        assert!(DType::parse("bool").is_discrete());
        assert!(DType::parse("uint8").is_discrete());
        assert!(DType::parse("complex64").is_float());
    }
}
