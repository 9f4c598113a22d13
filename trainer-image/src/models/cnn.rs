//! A small convolutional net without BatchNorm or dropout (`conv1`, `conv2`,
//! `fc1`, `fc2`), so data-parallel results match one process exactly.

use tch::nn;

/// Two 3×3 conv + ReLU + 2×2 max-pool stages, then two dense layers.
pub fn simple_cnn(p: &nn::Path, chw: [i64; 3], hidden: i64, classes: i64) -> nn::Sequential {
    let conv = nn::ConvConfig {
        padding: 1,
        ..Default::default()
    };
    let flat = 32 * (chw[1] / 4) * (chw[2] / 4);
    nn::seq()
        .add(nn::conv2d(p / "conv1", chw[0], 16, 3, conv))
        .add_fn(|x| x.relu().max_pool2d_default(2))
        .add(nn::conv2d(p / "conv2", 16, 32, 3, conv))
        .add_fn(|x| x.relu().max_pool2d_default(2).flatten(1, -1))
        .add(nn::linear(p / "fc1", flat, hidden, Default::default()))
        .add_fn(|x| x.relu())
        .add(nn::linear(p / "fc2", hidden, classes, Default::default()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::nn::Module;

    #[test]
    fn runs_on_digits_and_cifar_shapes() {
        for chw in [[1, 8, 8], [3, 32, 32]] {
            let vs = nn::VarStore::new(tch::Device::Cpu);
            let m = simple_cnn(&vs.root(), chw, 64, 10);
            let x = tch::Tensor::zeros([2, chw[0], chw[1], chw[2]], tch::kind::FLOAT_CPU);
            assert_eq!(m.forward(&x).size(), vec![2, 10]);
            assert_eq!(
                vs.variables()["fc1.weight"].size()[1],
                32 * (chw[1] / 4) * (chw[2] / 4)
            );
        }
    }
}
