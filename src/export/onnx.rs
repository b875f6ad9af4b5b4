//! ONNX export: the classifier as an ONNX graph (opset 17) with its preprocessing in the model's
//! metadata, so ONNX Runtime, onnx.js, TensorRT or a C++ program can run it without vramfit.
//!
//! The graph is written node by node from the trained [`Classifier`] (burn's ONNX exporter has no
//! GroupNorm, mean-over-dims or Erf). It uses a dozen standard ops:
//!
//! ```text
//! image [N, 3, H, W] f32, normalized          (or image_u8 [N, H, W, 3] u8, see OnnxInput)
//!   Conv (group = C for depthwise, no bias)
//!   GroupNorm as PyTorch's exporter writes it (not the GroupNormalization op, whose scale/bias
//!   changed in opset 21):
//!     Reshape [N, G, -1] -> InstanceNormalization (scale 1, bias 0 per group, epsilon)
//!     -> Reshape to Shape(x) -> BatchNormalization (scale gamma[C], bias beta[C], mean 0,
//!        variance 1, epsilon 0: the per-channel affine in one op)
//!   GELU, exact: x * (Erf(x / sqrt 2) + 1) * 0.5     (or Relu; ONNX Runtime fuses it)
//!   Add for residual blocks
//!   GlobalAveragePool -> Flatten -> Gemm (weight [in, out], as burn stores it)
//! outputs: logits [N, classes] f32, probabilities = Softmax(logits) [N, classes] f32
//! ```
//! Every formula matches burn's (`burn-nn` `group_norm`, biased variance; `burn-backend` `gelu`),
//! so ONNX Runtime reproduces `vramfit predict` within float rounding (the CI test compares them on
//! the 1000 bundled test images).
//!
//! The protobuf messages ([`proto`]) are the subset of `onnx/onnx.proto` (IR version 8) that a
//! model of this kind needs, with the field numbers of that file; prost encodes them.

use std::collections::HashMap;

use burn::module::Param;
use burn::tensor::Tensor;
use prost::Message;

use crate::config::Activation;
use crate::engine::error::{Error, Result};
use crate::export::metadata::ModelMetadata;
use crate::model::{Classifier, ConvNormAct};

pub mod proto;
pub use proto::*;

/// ONNX IR version written (IR 8 = ONNX 1.10+, the first with opset 17).
pub const IR_VERSION: i64 = 8;
/// Opset of the default domain that the graph uses.
pub const OPSET: i64 = 17;

/// What the exported graph takes as input.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnnxInput {
    /// `image`: `[N, 3, H, W]` f32, already normalized: `(pixel / 255 - mean) / std` per RGB
    /// channel, the mean and std stored in the metadata. As PyTorch-exported classifiers take it.
    #[default]
    F32Nchw,
    /// `image_u8`: `[N, H, W, 3]` u8 RGB pixels, as image libraries decode them; the graph
    /// casts, transposes and normalizes. The consumer only resizes/crops to `image_size`.
    U8Nhwc,
}

impl OnnxInput {
    /// The graph input's name.
    pub fn input_name(self) -> &'static str {
        match self {
            OnnxInput::F32Nchw => "image",
            OnnxInput::U8Nhwc => "image_u8",
        }
    }

    /// A one-line description of the input, stored as the `input_layout` metadata property.
    pub fn describe(self) -> &'static str {
        match self {
            OnnxInput::F32Nchw => "image: float32 [N, 3, H, W], RGB, (pixel / 255 - mean) / std",
            OnnxInput::U8Nhwc => "image_u8: uint8 [N, H, W, 3], RGB pixels 0..255 (normalized inside the graph)",
        }
    }
}

/// The ONNX encoding of the model for `metadata`, ready to write as `model.onnx`.
///
/// Spatial input size: `metadata.image_size` square, or symbolic (`height`, `width`) for
/// preprocess mode `none`, whose input size follows the image; the batch dimension is symbolic.
///
/// # Errors
/// [`Error::Device`] when a weight cannot be read back from the device.
pub fn to_onnx_bytes(model: &Classifier, metadata: &ModelMetadata, input: OnnxInput) -> Result<Vec<u8>> {
    let mut g = GraphBuilder::default();
    let mut x = g.input_preprocessing(input, metadata)?;
    let activation = metadata.model.activation;
    x = g.conv_norm_act(&x, &model.stem, "stem", activation)?;
    for (i, block) in model.blocks.iter().enumerate() {
        let y = g.conv_norm_act(&x, &block.dw, &format!("blocks.{i}.dw"), activation)?;
        let y = g.conv_norm_act(&y, &block.pw, &format!("blocks.{i}.pw"), activation)?;
        x = if block.residual() { g.node("Add", &[&y, &x], vec![]) } else { y };
    }
    let pooled = g.node("GlobalAveragePool", &[&x], vec![]); // [N, C, 1, 1]
    let flat = g.node("Flatten", &[&pooled], vec![attr_int("axis", 1)]); // [N, C]
    let weight = g.weight("head.weight", &model.head.weight)?; // [C, classes]
    let mut gemm_inputs = vec![flat, weight];
    if let Some(bias) = &model.head.bias {
        gemm_inputs.push(g.weight("head.bias", bias)?);
    }
    let refs: Vec<&str> = gemm_inputs.iter().map(String::as_str).collect();
    g.node_named("Gemm", &refs, "logits", vec![]);
    g.node_named("Softmax", &["logits"], "probabilities", vec![attr_int("axis", 1)]);

    let classes = metadata.class_names.len() as i64;
    let (h, w) = spatial_dims(metadata);
    let input_info = match input {
        OnnxInput::F32Nchw => value_info(input.input_name(), DataType::Float, vec![dim_param("batch"), dim(3), h, w]),
        OnnxInput::U8Nhwc => value_info(input.input_name(), DataType::Uint8, vec![dim_param("batch"), h, w, dim(3)]),
    };
    let graph = GraphProto {
        node: g.nodes,
        name: "vramfit_classifier".into(),
        initializer: g.initializers,
        input: vec![input_info],
        output: vec![
            value_info("logits", DataType::Float, vec![dim_param("batch"), dim(classes)]),
            value_info("probabilities", DataType::Float, vec![dim_param("batch"), dim(classes)]),
        ],
        doc_string: "GroupNorm + depthwise-separable classifier trained by vramfit".into(),
    };
    let model = ModelProto {
        ir_version: IR_VERSION,
        opset_import: vec![OperatorSetIdProto { domain: String::new(), version: OPSET }],
        producer_name: "vramfit".into(),
        producer_version: env!("CARGO_PKG_VERSION").into(),
        graph: Some(graph),
        metadata_props: metadata_props(metadata, input),
        doc_string: input.describe().into(),
    };
    Ok(model.encode_to_vec())
}

/// The metadata properties stored in the model (ONNX Runtime: `session.get_modelmeta().custom_metadata_map`).
///
/// Keys: `class_names` (JSON array, index = output column), `image_size` (pixels), `mean` and
/// `std` (JSON arrays of 3, RGB, applied to pixel / 255), `preprocess_mode`, `load_size`,
/// `crop_size` (see the README's preprocess table), `alpha` (transparent pixels: `white`,
/// `black` or `drop`), `input_layout` ([`OnnxInput::describe`]) and `vramfit_model_json` (the
/// whole `model.json`).
pub fn metadata_props(metadata: &ModelMetadata, input: OnnxInput) -> Vec<StringStringEntryProto> {
    let json = |v: serde_json::Value| v.to_string();
    // f32 in its shortest form ("0.286", not the f64 widening "0.28600001335144043").
    let floats = |v: &[f32; 3]| format!("[{}]", v.map(|x| format!("{x:?}")).join(","));
    let alpha = serde_json::to_value(metadata.alpha).ok().and_then(|v| v.as_str().map(String::from));
    let mode = serde_json::to_value(metadata.preprocess.mode).ok().and_then(|v| v.as_str().map(String::from));
    let entries = [
        ("class_names", json(serde_json::json!(metadata.class_names))),
        ("image_size", metadata.image_size.to_string()),
        ("mean", floats(&metadata.mean)),
        ("std", floats(&metadata.std)),
        ("preprocess_mode", mode.unwrap_or_default()),
        ("load_size", metadata.preprocess.load_size.to_string()),
        ("crop_size", metadata.preprocess.crop_size.to_string()),
        ("alpha", alpha.unwrap_or_default()),
        ("input_layout", input.describe().to_string()),
        ("vramfit_model_json", serde_json::to_string(metadata).unwrap_or_default()),
    ];
    entries.into_iter().map(|(key, value)| StringStringEntryProto { key: key.into(), value }).collect()
}

fn spatial_dims(metadata: &ModelMetadata) -> (tensor_shape_proto::Dimension, tensor_shape_proto::Dimension) {
    if metadata.preprocess.mode == crate::data::preprocess::PreprocessMode::None {
        (dim_param("height"), dim_param("width"))
    } else {
        (dim(metadata.image_size as i64), dim(metadata.image_size as i64))
    }
}

/// Collects nodes and initializers with unique value names.
#[derive(Default)]
struct GraphBuilder {
    nodes: Vec<NodeProto>,
    initializers: Vec<TensorProto>,
    constants: HashMap<String, String>,
    next: usize,
}

impl GraphBuilder {
    /// Adds a node with a fresh output name; returns that name.
    fn node(&mut self, op: &str, inputs: &[&str], attribute: Vec<AttributeProto>) -> String {
        self.next += 1;
        let out = format!("{}_{}", op.to_lowercase(), self.next);
        self.node_named(op, inputs, &out, attribute);
        out
    }

    fn node_named(&mut self, op: &str, inputs: &[&str], output: &str, attribute: Vec<AttributeProto>) {
        self.nodes.push(NodeProto {
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: vec![output.to_string()],
            name: format!("{op}_{}", self.nodes.len()),
            op_type: op.into(),
            attribute,
        });
    }

    /// A float constant of `shape` (shared by name when the same values recur); returns its name.
    fn constant(&mut self, name: &str, shape: &[i64], values: &[f32]) -> String {
        let key = format!("{name}{shape:?}{values:?}");
        if let Some(n) = self.constants.get(&key) {
            return n.clone();
        }
        let n = format!("const.{name}");
        self.initializers.push(float_tensor(&n, shape, values));
        self.constants.insert(key, n.clone());
        n
    }

    fn int64_constant(&mut self, name: &str, values: &[i64]) -> String {
        let key = format!("i64{name}{values:?}");
        if let Some(n) = self.constants.get(&key) {
            return n.clone();
        }
        let n = format!("const.{name}");
        self.initializers.push(TensorProto {
            dims: vec![values.len() as i64],
            data_type: DataType::Int64 as i32,
            name: n.clone(),
            raw_data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        });
        self.constants.insert(key, n.clone());
        n
    }

    /// A trained parameter as an f32 initializer named by its burn path; returns the name.
    fn weight<const D: usize>(&mut self, name: &str, param: &Param<Tensor<D>>) -> Result<String> {
        let (shape, values) = tensor_values(&param.val())?;
        self.initializers.push(float_tensor(name, &shape, &values));
        Ok(name.to_string())
    }

    /// The graph input and, for [`OnnxInput::U8Nhwc`], the nodes that turn it into the network's
    /// normalized `[N, 3, H, W]` f32 input. Returns the name of that f32 value.
    fn input_preprocessing(&mut self, input: OnnxInput, metadata: &ModelMetadata) -> Result<String> {
        match input {
            OnnxInput::F32Nchw => Ok(input.input_name().to_string()),
            OnnxInput::U8Nhwc => {
                let x = self.node("Cast", &[input.input_name()], vec![attr_int("to", DataType::Float as i64)]);
                let x = self.node("Transpose", &[&x], vec![attr_ints("perm", &[0, 3, 1, 2])]); // [N, 3, H, W]
                // (p / 255 - mean) / std = p * (1 / (255 std)) - mean / std: one Mul and one Sub
                // would round differently from vramfit's loader, so keep its order of operations.
                let scale = self.constant("255", &[], &[255.0]);
                let mean = self.constant("mean", &[1, 3, 1, 1], &metadata.mean);
                let std = self.constant("std", &[1, 3, 1, 1], &metadata.std);
                let x = self.node("Div", &[&x, &scale], vec![]);
                let x = self.node("Sub", &[&x, &mean], vec![]);
                Ok(self.node("Div", &[&x, &std], vec![]))
            }
        }
    }

    /// Convolution -> decomposed GroupNorm -> activation, as [`ConvNormAct`] computes in f32.
    fn conv_norm_act(&mut self, x: &str, layer: &ConvNormAct, name: &str, activation: Activation) -> Result<String> {
        let conv = &layer.conv;
        let weight = self.weight(&format!("{name}.conv.weight"), &conv.weight)?;
        let p = layer.padding() as i64;
        let attrs = vec![
            attr_ints("kernel_shape", &conv.kernel_size.map(|k| k as i64)),
            attr_ints("strides", &conv.stride.map(|s| s as i64)),
            attr_ints("dilations", &conv.dilation.map(|d| d as i64)),
            attr_ints("pads", &[p, p, p, p]),
            attr_int("group", conv.groups as i64),
        ];
        let y = self.node("Conv", &[x, &weight], attrs);
        let y = self.group_norm(&y, layer, name)?;
        Ok(match activation {
            Activation::Relu => self.node("Relu", &[&y], vec![]),
            Activation::Gelu => {
                // burn-backend: x * (erf(x / sqrt 2) + 1) / 2, with the halving as a Mul by 0.5
                // (the same value: both scale by a power of two) in the order ONNX Runtime's
                // GeluFusion matches, so it runs as one fused Gelu kernel, as PyTorch's export
                // does; a final Div by 2 left five separate passes over the tensor.
                let sqrt2 = self.constant("sqrt2", &[], &[std::f32::consts::SQRT_2]);
                let one = self.constant("1", &[], &[1.0]);
                let half = self.constant("0.5", &[], &[0.5]);
                let t = self.node("Div", &[&y, &sqrt2], vec![]);
                let t = self.node("Erf", &[&t], vec![]);
                let t = self.node("Add", &[&t, &one], vec![]);
                let t = self.node("Mul", &[&y, &t], vec![]);
                self.node("Mul", &[&t, &half], vec![])
            }
        })
    }

    /// GroupNorm as burn-nn computes it: per sample and group, `(x - mean) / sqrt(var + eps)`
    /// with the biased variance, then `* gamma + beta` per channel. The normalization is
    /// written as PyTorch's exporter writes it (`torch.onnx.export`, opset 17): the groups as
    /// the channels of an InstanceNormalization (unit scale, zero bias), which ONNX Runtime runs
    /// as one kernel; the decomposed form (ReduceMean, Sub, Mul, ReduceMean, Add, Sqrt, Div)
    /// made seven passes, and the whole file ran 25% slower than PyTorch's export (issue 52).
    /// The affine is one BatchNormalization where PyTorch writes a Mul and an Add.
    fn group_norm(&mut self, x: &str, layer: &ConvNormAct, name: &str) -> Result<String> {
        let norm = &layer.norm;
        let groups = norm.num_groups as i64;
        let grouped_shape = self.int64_constant(&format!("groups{groups}"), &[0, groups, -1]);
        let xg = self.node("Reshape", &[x, &grouped_shape], vec![]); // [N, G, C/G * H * W]
        let ones = self.constant(&format!("ones{groups}"), &[groups], &vec![1.0; norm.num_groups]);
        let zeros = self.constant(&format!("zeros{groups}"), &[groups], &vec![0.0; norm.num_groups]);
        let eps = attr_float("epsilon", norm.epsilon as f32);
        let z = self.node("InstanceNormalization", &[&xg, &ones, &zeros], vec![eps]);
        let shape = self.node("Shape", &[x], vec![]);
        let mut y = self.node("Reshape", &[&z, &shape], vec![]); // [N, C, H, W]
        let c = norm.num_channels as i64;
        if let (Some(gamma), Some(beta)) = (&norm.gamma, &norm.beta) {
            // `* gamma + beta` per channel as one BatchNormalization with mean 0, variance 1
            // and epsilon 0: `(y - 0) / sqrt(1 + 0) * gamma + beta`, the same values (ONNX
            // Runtime computes `y * gamma + beta`: 0.0 difference from a Mul and an Add on both
            // presets) in one pass over the tensor instead of two.
            let (_, g) = tensor_values(&gamma.val())?;
            let (_, b) = tensor_values(&beta.val())?;
            let gamma_name = format!("{name}.norm.gamma");
            let beta_name = format!("{name}.norm.beta");
            self.initializers.push(float_tensor(&gamma_name, &[c], &g));
            self.initializers.push(float_tensor(&beta_name, &[c], &b));
            let zeros = self.constant(&format!("zeros{c}"), &[c], &vec![0.0; norm.num_channels]);
            let ones = self.constant(&format!("ones{c}"), &[c], &vec![1.0; norm.num_channels]);
            let inputs = [y.as_str(), &gamma_name, &beta_name, &zeros, &ones];
            y = self.node("BatchNormalization", &inputs, vec![attr_float("epsilon", 0.0)]);
        }
        Ok(y)
    }
}

/// Shape and f32 values of a tensor, read back from its device.
fn tensor_values<const D: usize>(t: &Tensor<D>) -> Result<(Vec<i64>, Vec<f32>)> {
    let shape = t.dims().iter().map(|&d| d as i64).collect();
    let data = t.clone().cast(burn::tensor::FloatDType::F32).try_into_data().map_err(|e| Error::device(&e))?;
    let values = data.try_to_vec::<f32>().map_err(|e| Error::device(&e))?;
    Ok((shape, values))
}

fn float_tensor(name: &str, shape: &[i64], values: &[f32]) -> TensorProto {
    TensorProto {
        dims: shape.to_vec(),
        data_type: DataType::Float as i32,
        name: name.into(),
        raw_data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

fn attr_float(name: &str, f: f32) -> AttributeProto {
    AttributeProto { name: name.into(), r#type: AttributeType::Float as i32, f: Some(f), i: None, ints: vec![] }
}

fn attr_int(name: &str, i: i64) -> AttributeProto {
    AttributeProto { name: name.into(), r#type: AttributeType::Int as i32, f: None, i: Some(i), ints: vec![] }
}

fn attr_ints(name: &str, ints: &[i64]) -> AttributeProto {
    AttributeProto { name: name.into(), r#type: AttributeType::Ints as i32, f: None, i: None, ints: ints.to_vec() }
}

fn dim(value: i64) -> tensor_shape_proto::Dimension {
    tensor_shape_proto::Dimension { value: Some(tensor_shape_proto::dimension::Value::DimValue(value)) }
}

fn dim_param(name: &str) -> tensor_shape_proto::Dimension {
    tensor_shape_proto::Dimension { value: Some(tensor_shape_proto::dimension::Value::DimParam(name.into())) }
}

fn value_info(name: &str, elem_type: DataType, dims: Vec<tensor_shape_proto::Dimension>) -> ValueInfoProto {
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: elem_type as i32,
                shape: Some(TensorShapeProto { dim: dims }),
            })),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::export::TrainingInfo;

    fn tiny() -> (Classifier, ModelMetadata) {
        let mut config = Config::default();
        config.model.width = 0.25;
        let classes: Vec<String> = (0..3).map(|i| format!("c{i}")).collect();
        let model = Classifier::new(&config.model, 3, &burn::tensor::Device::flex());
        let meta = ModelMetadata::new(&config, &classes, 0, TrainingInfo::default());
        (model, meta)
    }

    #[test]
    fn the_encoding_decodes_to_one_node_per_op_in_order_with_every_weight() {
        let (model, meta) = tiny();
        let bytes = to_onnx_bytes(&model, &meta, OnnxInput::F32Nchw).unwrap();
        let decoded = ModelProto::decode(bytes.as_slice()).unwrap();
        assert_eq!((decoded.ir_version, decoded.opset_import[0].version), (IR_VERSION, OPSET));
        let graph = decoded.graph.unwrap();
        assert_eq!(graph.input[0].name, "image");
        assert_eq!(graph.output.iter().map(|o| o.name.as_str()).collect::<Vec<_>>(), ["logits", "probabilities"]);
        // Every value a node reads is a graph input, an initializer or an earlier node's output.
        let mut known: std::collections::HashSet<String> =
            graph.initializer.iter().map(|t| t.name.clone()).chain(["image".to_string()]).collect();
        for node in &graph.node {
            for i in &node.input {
                assert!(known.contains(i), "{} reads {i} before it exists", node.name);
            }
            known.extend(node.output.iter().cloned());
        }
        // The weights hold exactly the model's parameters (GroupNorm gamma/beta, conv, head).
        let weights: usize = graph
            .initializer
            .iter()
            .filter(|t| !t.name.starts_with("const."))
            .map(|t| t.dims.iter().product::<i64>() as usize)
            .sum();
        assert_eq!(weights, burn::module::Module::num_params(&model));
        let count = |op: &str| graph.node.iter().filter(|n| n.op_type == op).count();
        let layers = 1 + 2 * model.blocks.len();
        let residuals = model.blocks.iter().filter(|b| b.residual()).count();
        assert_eq!(count("Conv"), layers);
        // Each GroupNorm is one InstanceNormalization over the groups, as PyTorch exports it
        // (ONNX Runtime runs it as one kernel), and each GELU ends in the Mul by 0.5 that ONNX
        // Runtime's GeluFusion matches.
        assert_eq!(count("InstanceNormalization"), layers);
        assert_eq!((count("ReduceMean"), count("Sqrt")), (0, 0));
        assert_eq!(count("Erf"), layers);
        for erf in graph.node.iter().enumerate().filter(|(_, n)| n.op_type == "Erf") {
            let tail: Vec<&str> = graph.node[erf.0 + 1..erf.0 + 4].iter().map(|n| n.op_type.as_str()).collect();
            assert_eq!(tail, ["Add", "Mul", "Mul"]);
            assert_eq!(graph.node[erf.0 + 3].input[1], "const.0.5");
        }
        let norm = graph.node.iter().find(|n| n.op_type == "InstanceNormalization").unwrap();
        assert_eq!(norm.attribute[0].f, Some(model.stem.norm.epsilon as f32));
        // The affine: one BatchNormalization per layer with mean 0, variance 1 and epsilon 0;
        // the Muls and Adds left are GELU's (two and one) and the residuals'.
        assert_eq!((count("BatchNormalization"), count("Mul"), count("Add")), (layers, 2 * layers, layers + residuals));
        let affine = graph.node.iter().find(|n| n.op_type == "BatchNormalization").unwrap();
        assert_eq!(affine.attribute[0].f, Some(0.0));
        let values = |name: &str| {
            let t = graph.initializer.iter().find(|t| t.name == name).unwrap();
            t.raw_data.chunks(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect::<Vec<f32>>()
        };
        let channels = model.stem.norm.num_channels;
        assert_eq!(values(&affine.input[1]).len(), channels);
        assert_eq!((values(&affine.input[3]), values(&affine.input[4])), (vec![0.0; channels], vec![1.0; channels]));
        let props: HashMap<_, _> = decoded.metadata_props.iter().map(|p| (p.key.as_str(), p.value.as_str())).collect();
        assert_eq!(props["class_names"], r#"["c0","c1","c2"]"#);
        assert_eq!(props["image_size"], meta.image_size.to_string());
        let mean: Vec<f32> = serde_json::from_str(props["mean"]).unwrap();
        assert_eq!(mean, meta.mean, "{}", props["mean"]);
    }

    #[test]
    fn the_u8_input_is_nhwc_and_normalized_inside_the_graph() {
        let (model, meta) = tiny();
        let bytes = to_onnx_bytes(&model, &meta, OnnxInput::U8Nhwc).unwrap();
        let graph = ModelProto::decode(bytes.as_slice()).unwrap().graph.unwrap();
        assert_eq!(graph.input[0].name, "image_u8");
        let ops: Vec<&str> = graph.node.iter().take(5).map(|n| n.op_type.as_str()).collect();
        assert_eq!(ops, ["Cast", "Transpose", "Div", "Sub", "Div"]);
        let Some(type_proto::Value::TensorType(t)) = graph.input[0].r#type.clone().unwrap().value else {
            panic!("no tensor type")
        };
        assert_eq!(t.elem_type, DataType::Uint8 as i32);
        let last = &t.shape.unwrap().dim[3];
        assert_eq!(last.value, Some(tensor_shape_proto::dimension::Value::DimValue(3)));
    }
}
