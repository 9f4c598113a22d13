//! A three-layer perceptron over flattened inputs (`fc1`, `fc2`, `fc3`).

use tch::nn;

/// `inputs → hidden → hidden → classes` with ReLU.
pub fn mlp(p: &nn::Path, inputs: i64, hidden: i64, classes: i64) -> nn::Sequential {
    nn::seq()
        .add_fn(|x| x.flatten(1, -1))
        .add(nn::linear(p / "fc1", inputs, hidden, Default::default()))
        .add_fn(|x| x.relu())
        .add(nn::linear(p / "fc2", hidden, hidden, Default::default()))
        .add_fn(|x| x.relu())
        .add(nn::linear(p / "fc3", hidden, classes, Default::default()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::nn::Module;

    #[test]
    fn names_and_shapes() {
        let vs = nn::VarStore::new(tch::Device::Cpu);
        let m = mlp(&vs.root(), 64, 32, 10);
        let v = vs.variables();
        assert_eq!(v["fc1.weight"].size(), vec![32, 64]);
        assert_eq!(v["fc3.bias"].size(), vec![10]);
        assert_eq!(v.len(), 6);
        let y = m.forward(&tch::Tensor::zeros([5, 1, 8, 8], tch::kind::FLOAT_CPU));
        assert_eq!(y.size(), vec![5, 10]);
    }
}
