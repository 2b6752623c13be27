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
//! - `Sum` / `Mean`: linear reductions, each output the sum (or the mean)
//!   of K input elements. Their result may cancel to far below the partial
//!   sums it went through, and rounding is relative to those (see
//!   `metrics::output_floor`).
//! - `Movement`: ops that only select, move, copy or repeat elements (views,
//!   indexing, concatenation, copies). They do no arithmetic, so they cannot
//!   make an error, only concentrate one that their input already holds (a
//!   selected row can hold more of the error than the whole tensor).
//! - `Elementwise`: each output element a smooth function of the same
//!   elements of the inputs that neither adds nor subtracts them (products,
//!   quotients, activations, and the backward kernels that multiply the
//!   gradient by a local derivative). Their rounding is relative to the
//!   output itself, and a relative input error grows through them by about
//!   the function's condition number, a small constant. Sums and
//!   differences (`add`, `sub`) are not among them: they can cancel.
//! - `ElementwiseSum`: element-wise ops that add a term to their `self`
//!   (`addcmul`, `addcdiv`, `lerp`: `self + T`). They can cancel, but only
//!   against `self`: their rounding is relative to `self` and `T`, whose
//!   scale the output and `self` bound (`‖T‖ ≤ ‖out‖ + ‖self‖`), not to
//!   the factors of `T` (Adam's `exp_avg_sq + (1−β2)·g·g` is 1e-11 where
//!   `g` is 7e-5).
//!
//! `_foreach_X` list ops are classed as `X`, per element.
//!
//! Names are matched without namespace and without a trailing `_` (in-place)
//! so `aten::normal_` and `aten::normal` are both random.

/// What kind of computation an op does, for its tolerance and verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpClass {
    /// Anything not named below.
    Plain,
    /// Random: outputs may differ between runs.
    Rng,
    /// Discontinuous in its inputs (comparisons, rounding, argmax): a small input error may change an output completely.
    Discontinuous,
    /// Matrix products and convolutions: a reduction over the contracted dimension.
    Contraction,
    /// Normalizations and softmax: a reduction along a row.
    Normalization,
    /// Sums: may cancel.
    Sum,
    /// Means.
    Mean,
    /// Moves or copies elements without computing.
    Movement,
    /// Smooth element-wise functions (see the module's notes).
    Elementwise,
    /// Element-wise `self + T` (see the module's notes).
    ElementwiseSum,
}

impl OpClass {
    /// The class's name in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            OpClass::Plain => "plain",
            OpClass::Rng => "rng",
            OpClass::Discontinuous => "discontinuous",
            OpClass::Contraction => "contraction",
            OpClass::Normalization => "normalization",
            OpClass::Sum => "sum",
            OpClass::Mean => "mean",
            OpClass::Movement => "movement",
            OpClass::Elementwise => "elementwise",
            OpClass::ElementwiseSum => "elementwise_sum",
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

/// Contractions other than [`PRODUCTS`] (which are contractions too).
const CONTRACTION: &[&str] = &[
    "addr",
    "einsum",
    "tensordot",
    "_scaled_mm",
    "bilinear",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv_transpose3d",
    "scaled_dot_product_attention",
    "_scaled_dot_product_attention_math",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention_for_cpu_backward",
    "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_efficient_attention_backward",
    "_scaled_dot_product_cudnn_attention_backward",
    "_flash_attention_backward",
    "_efficient_attention_backward",
    "convolution_backward",
    "convolution_backward_overrideable",
    "_flash_attention_forward",
    "_efficient_attention_forward",
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

const SUM: &[&str] = &["sum", "nansum", "sum_to_size", "_sum_to"];

const MEAN: &[&str] = &[
    "mean",
    "nanmean",
    "avg_pool1d",
    "avg_pool2d",
    "avg_pool3d",
    "adaptive_avg_pool1d",
    "adaptive_avg_pool2d",
    "adaptive_avg_pool3d",
    "_adaptive_avg_pool2d",
    "_adaptive_avg_pool3d",
];

/// Ops whose every output element is a copy of an input element (or a
/// constant such as the zeros of `triu` or of padding), possibly cast to
/// another dtype.
const MOVEMENT: &[&str] = &[
    "alias",
    "as_strided",
    "as_strided_scatter",
    "cat",
    "_cat",
    "chunk",
    "clone",
    "constant_pad_nd",
    "contiguous",
    "copy",
    "_copy_from",
    "_copy_from_and_resize",
    "_to_copy",
    "_to_cpu",
    "to",
    "detach",
    "diagonal",
    "embedding",
    "expand",
    "expand_as",
    "flatten",
    "flip",
    "gather",
    "index",
    "index_select",
    "lift_fresh",
    "lift_fresh_copy",
    "masked_select",
    "movedim",
    "moveaxis",
    "narrow",
    "narrow_copy",
    "pad",
    "permute",
    "repeat",
    "repeat_interleave",
    "reshape",
    "_reshape_alias",
    "roll",
    "select",
    "slice",
    "split",
    "split_with_sizes",
    "squeeze",
    "stack",
    "t",
    "take",
    "take_along_dim",
    "tile",
    "transpose",
    "tril",
    "triu",
    "unbind",
    "unflatten",
    "unfold",
    "unsafe_split",
    "unsafe_chunk",
    "unsqueeze",
    "view",
    "_unsafe_view",
    "view_as",
];

/// Element-wise ops that do not cancel (see the module comment): judged
/// relative to their own output, with an allowance for their inputs' drift
/// of about their condition number. `exp`, `log`, `sin`, `cos` are left
/// out: their condition number (|x|, 1/|log x|, |x cot x|) is unbounded.
const ELEMENTWISE: &[&str] = &[
    "mul",
    "div",
    "neg",
    "abs",
    "relu",
    "relu6",
    "gelu",
    "silu",
    "sigmoid",
    "tanh",
    "softplus",
    "elu",
    "selu",
    "celu",
    "leaky_relu",
    "hardtanh",
    "hardswish",
    "hardsigmoid",
    "mish",
    "threshold",
    "erf",
    "sqrt",
    "rsqrt",
    "reciprocal",
    "square",
    "where",
    "masked_fill",
    "clamp",
    "clamp_min",
    "clamp_max",
    "gelu_backward",
    "silu_backward",
    "threshold_backward",
    "sigmoid_backward",
    "tanh_backward",
    "softplus_backward",
    "elu_backward",
    "leaky_relu_backward",
    "hardtanh_backward",
    "hardswish_backward",
    "hardsigmoid_backward",
    "mish_backward",
    "nll_loss_backward",
];

/// Element-wise ops that add one term to their `self`: `self + T`.
const ELEMENTWISE_SUM: &[&str] = &["addcmul", "addcdiv", "lerp"];

/// Whether `op` is `lerp`, whose term `w·(end − self)` rounds relative to
/// `end` and `self` before it is scaled by `w` (see `metrics`).
pub fn is_lerp(op: &str) -> bool {
    per_element(base_name(op)) == "lerp"
}

/// A `_foreach_X` list op's per-element op `X`; any other name as it is.
fn per_element(base: &str) -> &str {
    base.strip_prefix("_foreach_")
        .filter(|x| !x.is_empty())
        .unwrap_or(base)
}

/// Backward kernels of normalizations whose outputs are combinations of
/// terms of the gradient's size (`y·(g − Σ g·y)`, `g − exp(y)·Σ g`, a
/// norm's `(g·w − mean(g·w) − x̂·mean(g·w·x̂))/σ`, and its weight and bias
/// gradients `Σ g·x̂`, `Σ g` over the rows): their rounding is relative to
/// the gradient, not to the forward tensors they also read, which are often
/// 10⁴ times larger.
const GRADIENT_TERMS: &[&str] = &[
    "_softmax_backward_data",
    "_log_softmax_backward_data",
    "native_layer_norm_backward",
    "native_group_norm_backward",
    "native_batch_norm_backward",
    "_fused_rms_norm_backward",
];

/// The arguments that carry the gradient into a backward kernel.
pub fn is_gradient_arg(arg: &str) -> bool {
    matches!(arg, "grad_output" | "grad_out" | "grad")
}

/// Whether `op`'s output is made of terms of its gradient's size (see
/// [`GRADIENT_TERMS`]).
pub fn has_gradient_terms(op: &str) -> bool {
    let base = base_name(op);
    GRADIENT_TERMS.contains(&base)
}

/// Contractions whose every output element is a sum of K products of one
/// element of each of two inputs (matrix products, convolutions): their
/// partial sums have the scale √K·r₁·r₂ (`metrics::product_floor`).
/// Attention is left out: its output is an average of `v`, not a sum of
/// products of two of its inputs.
const PRODUCTS: &[&str] = &[
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
    "convolution",
    "_convolution",
    "conv1d",
    "conv2d",
    "conv3d",
    "convolution_overrideable",
    "cudnn_convolution",
    "mkldnn_convolution",
    "mkldnn_linear",
];

/// Whether `op` is a sum of products of two inputs (see [`PRODUCTS`]).
pub fn is_product(op: &str) -> bool {
    let base = base_name(op);
    PRODUCTS.contains(&base) || PRODUCTS.contains(&base.trim_matches('_'))
}

/// Whether argument `arg` of product `op` is one of its two factors: not a
/// bias, and not the term that `addmm`-style ops add (`self`).
pub fn is_factor(op: &str, arg: &str) -> bool {
    let base = base_name(op);
    let adds_self = base.starts_with("add") || base.starts_with("baddbmm");
    !(arg == "bias" || (adds_self && arg == "self"))
}

/// The bare name: `aten::normal_` -> `normal`.
pub fn base_name(op: &str) -> &str {
    let name = after_last_colons(op);
    let trimmed = name.strip_suffix('_').unwrap_or(name);
    // `__and__`-style dunder names keep their underscores.
    if trimmed.is_empty() || trimmed.ends_with('_') {
        name
    } else {
        trimmed
    }
}

/// What follows the last `::` of `op` (all of it without one): what
/// `op.rsplit("::").next()` gives, without building a substring searcher
/// per call (measuring asks this of every pair's op several times).
pub fn after_last_colons(op: &str) -> &str {
    match op.as_bytes().windows(2).rposition(|w| w == b"::") {
        Some(i) => &op[i + 2..],
        None => op,
    }
}

/// The class of op `op` (`aten::gelu`, with or without namespace or trailing `_`).
pub fn classify(op: &str) -> OpClass {
    let base = per_element(base_name(op));
    let bare = base.trim_matches('_');
    let is = |list: &[&str]| list.contains(&base) || list.contains(&bare);
    if is(RNG) {
        OpClass::Rng
    } else if is(DISCONTINUOUS) {
        OpClass::Discontinuous
    } else if is(CONTRACTION) || is(PRODUCTS) {
        OpClass::Contraction
    } else if is(NORMALIZATION) {
        OpClass::Normalization
    } else if is(SUM) {
        OpClass::Sum
    } else if is(MEAN) {
        OpClass::Mean
    } else if is(MOVEMENT) {
        OpClass::Movement
    } else if is(ELEMENTWISE) {
        OpClass::Elementwise
    } else if is(ELEMENTWISE_SUM) {
        OpClass::ElementwiseSum
    } else {
        OpClass::Plain
    }
}

/// Whether arguments can make `op` discontinuous: only `div`'s can (see
/// [`args_make_discontinuous`]), so other ops need not read theirs.
pub fn args_may_make_discontinuous(op: &str) -> bool {
    base_name(op) == "div"
}

/// `div` with a rounding mode floors or truncates: discontinuous.
pub fn args_make_discontinuous(op: &str, args: &str) -> bool {
    args_may_make_discontinuous(op)
        && args
            .split(',')
            .any(|kv| kv.trim().starts_with("rounding_mode") && !kv.contains("None"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn after_last_colons_is_the_last_piece_of_rsplit() {
        for op in [
            "aten::addmm",
            "addmm",
            "",
            "::",
            ":::",
            "a:::b",
            "a::b::c",
            "x::a:b",
            "a:",
            ":a",
            "aten::",
            "::mm",
            "ns::é::ü",
        ] {
            assert_eq!(
                after_last_colons(op),
                op.rsplit("::").next().unwrap(),
                "{op:?}"
            );
        }
    }

    proptest::proptest! {
        #[test]
        fn after_last_colons_matches_rsplit_on_any_name(op in "[a:é_]{0,16}") {
            proptest::prop_assert_eq!(after_last_colons(&op), op.rsplit("::").next().unwrap());
        }
    }

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
        assert_eq!(classify("aten::sub"), OpClass::Plain);
        assert_eq!(classify("aten::gelu_backward"), OpClass::Elementwise);
        assert_eq!(classify("aten::mul_"), OpClass::Elementwise);
        assert_eq!(classify("aten::nll_loss_backward"), OpClass::Elementwise);
        assert!(has_gradient_terms("aten::_softmax_backward_data"));
        assert!(has_gradient_terms("aten::native_layer_norm_backward"));
        assert!(!has_gradient_terms("aten::gelu_backward"));
        assert_eq!(classify("aten::addcmul_"), OpClass::ElementwiseSum);
        assert_eq!(classify("aten::lerp"), OpClass::ElementwiseSum);
        assert_eq!(classify("aten::_foreach_addcmul_"), OpClass::ElementwiseSum);
        assert_eq!(classify("aten::_foreach_sqrt"), OpClass::Elementwise);
        assert_eq!(classify("aten::_foreach_mul_"), OpClass::Elementwise);
        assert_eq!(classify("aten::_foreach_add_"), OpClass::Plain);
        assert_eq!(classify("aten::_foreach_norm"), OpClass::Normalization);
        assert_eq!(classify("aten::_fused_adamw_"), OpClass::Plain);
        assert!(is_lerp("aten::_foreach_lerp_") && !is_lerp("aten::addcmul"));
        assert_eq!(classify("aten::sum"), OpClass::Sum);
        assert_eq!(classify("aten::mean"), OpClass::Mean);
        assert_eq!(classify("aten::as_strided"), OpClass::Movement);
        assert_eq!(classify("aten::copy_"), OpClass::Movement);
        assert_eq!(classify("aten::embedding"), OpClass::Movement);
        assert!(is_product("aten::addmm") && is_product("aten::convolution_overrideable"));
        assert!(!is_product("aten::scaled_dot_product_attention"));
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
