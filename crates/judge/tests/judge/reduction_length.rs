//! The reduction length per op: how many elements each output element is
//! summed from, which sets the rounding two correct kernels may differ by.

use opdump_judge::metrics::reduction_length_of_shapes;
use opdump_judge::opclass::classify;

fn k(op: &str, inputs: &[&[i64]], out: &[i64]) -> f64 {
    reduction_length_of_shapes(op, classify(op), inputs, out.iter().product())
}

#[test]
fn matrix_products_reduce_over_the_contracted_dimension() {
    // [512,128] @ [128,2000]: 128 products per output element, not 2000.
    assert_eq!(
        k("aten::mm", &[&[512, 128], &[128, 2000]], &[512, 2000]),
        128.0
    );
    assert_eq!(
        k(
            "aten::addmm",
            &[&[2000], &[512, 128], &[128, 2000]],
            &[512, 2000]
        ),
        128.0
    );
    assert_eq!(
        k("aten::bmm", &[&[8, 64, 32], &[8, 32, 300]], &[8, 64, 300]),
        32.0
    );
    assert_eq!(
        k(
            "aten::baddbmm",
            &[&[8, 64, 300], &[8, 64, 32], &[8, 32, 300]],
            &[8, 64, 300]
        ),
        32.0
    );
    assert_eq!(
        k("aten::matmul", &[&[4, 16, 24], &[24, 700]], &[4, 16, 700]),
        24.0
    );
    assert_eq!(
        k(
            "aten::linear",
            &[&[4, 16, 24], &[700, 24], &[700]],
            &[4, 16, 700]
        ),
        24.0
    );
    // The backward's weight gradient contracts over the rows: [m,n]^T-like
    // operands arrive as the first factor with that dimension last.
    assert_eq!(
        k("aten::mm", &[&[2000, 512], &[512, 128]], &[2000, 128]),
        512.0
    );
}

#[test]
fn convolutions_reduce_over_a_weight_filter() {
    // in-channels x kernel: 16 x 3 x 3 = 144 per output element.
    let x: &[i64] = &[2, 16, 32, 32];
    let w: &[i64] = &[64, 16, 3, 3];
    assert_eq!(k("aten::convolution", &[x, w], &[2, 64, 30, 30]), 144.0);
    // Grouped: 4 groups of 4 input channels.
    assert_eq!(
        k("aten::convolution", &[x, &[64, 4, 3, 3]], &[2, 64, 30, 30]),
        36.0
    );
    // Transposed, 16 -> 8 channels: the weight is [16, 8, 3, 3]; each output
    // element sums at most 16 x 3 x 3.
    assert_eq!(
        k("aten::convolution", &[x, &[16, 8, 3, 3]], &[2, 8, 34, 34]),
        144.0
    );
}

#[test]
fn reductions_reduce_over_the_reduced_elements() {
    assert_eq!(k("aten::sum", &[&[512, 512]], &[1, 512]), 512.0);
    assert_eq!(k("aten::mean", &[&[4, 1000]], &[]), 4000.0);
    assert_eq!(k("aten::_softmax", &[&[4, 8, 77]], &[4, 8, 77]), 77.0);
    assert_eq!(k("aten::gelu", &[&[4, 1000]], &[4, 1000]), 1.0);
}
