//! What an op's name says about how its outputs may differ across devices.
//!
//! - `Rng`: random ops. Two devices have different generators, so their
//!   outputs legitimately differ.
//! - `Discontinuous`: outputs jump on tiny input differences (comparisons,
//!   argmax, rounding). A flipped comparison is not a faulty kernel. The
//!   integer outputs of ops with float inputs (topk/sort/max indices, casts
//!   to integer types) are treated the same way by `metrics`, whatever the
//!   op.
//! - `Contraction` / `Normalization`: continuous ops that reduce along a
//!   dimension the numel ratio of inputs to outputs does not reveal (matmul's
//!   inner dimension, softmax's row); the tolerance needs that length.
//!
//! Names are matched without namespace and without a trailing `_` (in-place)
//! so `aten::normal_` and `aten::normal` are both random.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpClass {
    Plain,
    Rng,
    Discontinuous,
    Contraction,
    Normalization,
}

impl OpClass {
    pub fn as_str(self) -> &'static str {
        match self {
            OpClass::Plain => "plain",
            OpClass::Rng => "rng",
            OpClass::Discontinuous => "discontinuous",
            OpClass::Contraction => "contraction",
            OpClass::Normalization => "normalization",
        }
    }
}

const RNG: &[&str] = &[
    "normal",
    "uniform",
    "bernoulli",
    "rand",
    "rand_like",
    "randn",
    "randn_like",
    "randint",
    "randint_like",
    "randperm",
    "random",
    "exponential",
    "geometric",
    "log_normal",
    "cauchy",
    "multinomial",
    "poisson",
    "binomial",
    "dropout",
    "native_dropout",
    "feature_dropout",
    "alpha_dropout",
    "feature_alpha_dropout",
    "_fused_dropout",
    "fused_dropout",
    "rrelu",
    "rrelu_with_noise",
    "_standard_gamma",
    "_sample_dirichlet",
    "_dirichlet_grad",
    "gumbel_softmax",
    "_fused_rms_norm_dropout",
    "native_dropout_rng",
];

const DISCONTINUOUS: &[&str] = &[
    "eq",
    "ne",
    "lt",
    "le",
    "gt",
    "ge",
    "greater",
    "greater_equal",
    "less",
    "less_equal",
    "not_equal",
    "equal",
    "isclose",
    "allclose",
    "argmax",
    "argmin",
    "argsort",
    "searchsorted",
    "bucketize",
    "histc",
    "histogram",
    "nonzero",
    "nonzero_static",
    "argwhere",
    "unique",
    "_unique",
    "_unique2",
    "unique_consecutive",
    "unique_dim",
    "round",
    "floor",
    "ceil",
    "trunc",
    "fix",
    "sign",
    "sgn",
    "signbit",
    "heaviside",
    "remainder",
    "fmod",
    "floor_divide",
];

const CONTRACTION: &[&str] = &[
    "mm",
    "bmm",
    "addmm",
    "addbmm",
    "baddbmm",
    "matmul",
    "linear",
    "_addmm_activation",
    "dot",
    "vdot",
    "mv",
    "addmv",
    "addr",
    "einsum",
    "tensordot",
    "_scaled_mm",
    "bilinear",
    "convolution",
    "_convolution",
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv_transpose3d",
    "cudnn_convolution",
    "mkldnn_convolution",
    "scaled_dot_product_attention",
    "_scaled_dot_product_attention_math",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_flash_attention_forward",
    "_efficient_attention_forward",
    "mkldnn_linear",
    "_weight_int8pack_mm",
    "_int_mm",
    "cdist",
    "_cdist_forward",
];

const NORMALIZATION: &[&str] = &[
    "softmax",
    "_softmax",
    "log_softmax",
    "_log_softmax",
    "_softmax_backward_data",
    "_log_softmax_backward_data",
    "layer_norm",
    "native_layer_norm",
    "native_layer_norm_backward",
    "group_norm",
    "native_group_norm",
    "native_group_norm_backward",
    "batch_norm",
    "native_batch_norm",
    "_native_batch_norm_legit",
    "native_batch_norm_backward",
    "_batch_norm_impl_index",
    "instance_norm",
    "rms_norm",
    "_fused_rms_norm",
    "_fused_rms_norm_backward",
    "logsumexp",
    "cumsum",
    "cumprod",
    "logcumsumexp",
    "cross_entropy",
    "cross_entropy_loss",
    "nll_loss",
    "nll_loss_forward",
    "nll_loss_backward",
    "nll_loss2d",
    "normalize",
    "norm",
    "linalg_vector_norm",
    "_weight_norm",
    "var",
    "std",
    "var_mean",
    "std_mean",
];

/// The bare name: `aten::normal_` -> `normal`.
pub fn base_name(op: &str) -> &str {
    let name = op.rsplit("::").next().unwrap_or(op);
    let trimmed = name.strip_suffix('_').unwrap_or(name);
    // `__and__`-style dunder names keep their underscores.
    if trimmed.is_empty() || trimmed.ends_with('_') {
        name
    } else {
        trimmed
    }
}

pub fn classify(op: &str) -> OpClass {
    let base = base_name(op);
    let bare = base.trim_matches('_');
    let is = |list: &[&str]| list.contains(&base) || list.contains(&bare);
    if is(RNG) {
        OpClass::Rng
    } else if is(DISCONTINUOUS) {
        OpClass::Discontinuous
    } else if is(CONTRACTION) {
        OpClass::Contraction
    } else if is(NORMALIZATION) {
        OpClass::Normalization
    } else {
        OpClass::Plain
    }
}

/// `div` with a rounding mode floors or truncates: discontinuous.
pub fn args_make_discontinuous(op: &str, args: &str) -> bool {
    base_name(op) == "div"
        && args
            .split(',')
            .any(|kv| kv.trim().starts_with("rounding_mode") && !kv.contains("None"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes() {
        assert_eq!(classify("aten::normal_"), OpClass::Rng);
        assert_eq!(classify("aten::native_dropout"), OpClass::Rng);
        assert_eq!(classify("aten::bernoulli_"), OpClass::Rng);
        assert_eq!(classify("aten::eq"), OpClass::Discontinuous);
        assert_eq!(classify("aten::argmax"), OpClass::Discontinuous);
        assert_eq!(classify("aten::addmm"), OpClass::Contraction);
        assert_eq!(classify("aten::_softmax"), OpClass::Normalization);
        assert_eq!(classify("aten::add_"), OpClass::Plain);
        assert_eq!(classify("aten::__and__"), OpClass::Plain);
        assert_eq!(classify("mylib::custom"), OpClass::Plain);
        assert!(args_make_discontinuous(
            "aten::div",
            "rounding_mode='floor'"
        ));
        assert!(!args_make_discontinuous("aten::div", ""));
        assert!(!args_make_discontinuous(
            "aten::mul",
            "rounding_mode='floor'"
        ));
    }
}
