//! The onnx.proto messages vramfit writes, with that file's field numbers (proto2; prost writes
//! every field that is set, `Option` where zero is a meaningful value).

use prost::Message;

/// `onnx.ModelProto`.
#[derive(Clone, PartialEq, Message)]
pub struct ModelProto {
    /// IR version ([`super::IR_VERSION`]).
    #[prost(int64, tag = "1")]
    pub ir_version: i64,
    /// Operator sets used.
    #[prost(message, repeated, tag = "8")]
    pub opset_import: Vec<OperatorSetIdProto>,
    /// "vramfit".
    #[prost(string, tag = "2")]
    pub producer_name: String,
    /// vramfit's version.
    #[prost(string, tag = "3")]
    pub producer_version: String,
    /// Human-readable description.
    #[prost(string, tag = "6")]
    pub doc_string: String,
    /// The graph.
    #[prost(message, optional, tag = "7")]
    pub graph: Option<GraphProto>,
    /// Key-value metadata ([`super::metadata_props`]).
    #[prost(message, repeated, tag = "14")]
    pub metadata_props: Vec<StringStringEntryProto>,
}

/// `onnx.OperatorSetIdProto`.
#[derive(Clone, PartialEq, Message)]
pub struct OperatorSetIdProto {
    /// Empty for the default ONNX domain.
    #[prost(string, tag = "1")]
    pub domain: String,
    /// Opset version.
    #[prost(int64, tag = "2")]
    pub version: i64,
}

/// `onnx.StringStringEntryProto`.
#[derive(Clone, PartialEq, Message)]
pub struct StringStringEntryProto {
    /// Key.
    #[prost(string, tag = "1")]
    pub key: String,
    /// Value.
    #[prost(string, tag = "2")]
    pub value: String,
}

/// `onnx.GraphProto`.
#[derive(Clone, PartialEq, Message)]
pub struct GraphProto {
    /// Nodes in topological order.
    #[prost(message, repeated, tag = "1")]
    pub node: Vec<NodeProto>,
    /// Graph name.
    #[prost(string, tag = "2")]
    pub name: String,
    /// Weights and constants.
    #[prost(message, repeated, tag = "5")]
    pub initializer: Vec<TensorProto>,
    /// Description.
    #[prost(string, tag = "10")]
    pub doc_string: String,
    /// Graph inputs.
    #[prost(message, repeated, tag = "11")]
    pub input: Vec<ValueInfoProto>,
    /// Graph outputs.
    #[prost(message, repeated, tag = "12")]
    pub output: Vec<ValueInfoProto>,
}

/// `onnx.NodeProto`.
#[derive(Clone, PartialEq, Message)]
pub struct NodeProto {
    /// Input value names.
    #[prost(string, repeated, tag = "1")]
    pub input: Vec<String>,
    /// Output value names.
    #[prost(string, repeated, tag = "2")]
    pub output: Vec<String>,
    /// Node name.
    #[prost(string, tag = "3")]
    pub name: String,
    /// Operator, e.g. `Conv`.
    #[prost(string, tag = "4")]
    pub op_type: String,
    /// Attributes.
    #[prost(message, repeated, tag = "5")]
    pub attribute: Vec<AttributeProto>,
}

/// `onnx.AttributeProto` (the int and ints kinds this graph uses).
#[derive(Clone, PartialEq, Message)]
pub struct AttributeProto {
    /// Attribute name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// [`AttributeType`].
    #[prost(int32, tag = "20")]
    pub r#type: i32,
    /// Value of a FLOAT attribute.
    #[prost(float, optional, tag = "2")]
    pub f: Option<f32>,
    /// Value of an INT attribute.
    #[prost(int64, optional, tag = "3")]
    pub i: Option<i64>,
    /// Values of an INTS attribute.
    #[prost(int64, repeated, tag = "8")]
    pub ints: Vec<i64>,
}

/// `onnx.AttributeProto.AttributeType` (the kinds used).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttributeType {
    /// One float32.
    Float = 1,
    /// One int64.
    Int = 2,
    /// Repeated int64.
    Ints = 7,
}

/// `onnx.TensorProto` (dense, raw little-endian data).
#[derive(Clone, PartialEq, Message)]
pub struct TensorProto {
    /// Shape.
    #[prost(int64, repeated, tag = "1")]
    pub dims: Vec<i64>,
    /// [`DataType`].
    #[prost(int32, tag = "2")]
    pub data_type: i32,
    /// Name (initializers: the value name nodes refer to).
    #[prost(string, tag = "8")]
    pub name: String,
    /// Values, little-endian, row-major.
    #[prost(bytes = "vec", tag = "9")]
    pub raw_data: Vec<u8>,
}

/// `onnx.TensorProto.DataType` (the types used).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataType {
    /// f32.
    Float = 1,
    /// u8.
    Uint8 = 2,
    /// i64.
    Int64 = 7,
}

/// `onnx.ValueInfoProto`.
#[derive(Clone, PartialEq, Message)]
pub struct ValueInfoProto {
    /// Value name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Type and shape.
    #[prost(message, optional, tag = "2")]
    pub r#type: Option<TypeProto>,
}

/// `onnx.TypeProto` (tensor types only).
#[derive(Clone, PartialEq, Message)]
pub struct TypeProto {
    /// The type.
    #[prost(oneof = "type_proto::Value", tags = "1")]
    pub value: Option<type_proto::Value>,
}

/// Nested messages of [`TypeProto`].
pub mod type_proto {
    /// `onnx.TypeProto.Tensor`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Tensor {
        /// Element [`super::DataType`].
        #[prost(int32, tag = "1")]
        pub elem_type: i32,
        /// Shape.
        #[prost(message, optional, tag = "2")]
        pub shape: Option<super::TensorShapeProto>,
    }

    /// The `value` oneof.
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Value {
        /// A tensor type.
        #[prost(message, tag = "1")]
        TensorType(Tensor),
    }
}

/// `onnx.TensorShapeProto`.
#[derive(Clone, PartialEq, Message)]
pub struct TensorShapeProto {
    /// Dimensions, outermost first.
    #[prost(message, repeated, tag = "1")]
    pub dim: Vec<tensor_shape_proto::Dimension>,
}

/// Nested messages of [`TensorShapeProto`].
pub mod tensor_shape_proto {
    /// `onnx.TensorShapeProto.Dimension`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Dimension {
        /// A fixed size or a symbolic name.
        #[prost(oneof = "dimension::Value", tags = "1, 2")]
        pub value: Option<dimension::Value>,
    }

    /// Nested messages of [`Dimension`].
    pub mod dimension {
        /// The `value` oneof.
        #[derive(Clone, PartialEq, prost::Oneof)]
        pub enum Value {
            /// Fixed size.
            #[prost(int64, tag = "1")]
            DimValue(i64),
            /// Symbolic size, e.g. `batch`.
            #[prost(string, tag = "2")]
            DimParam(String),
        }
    }
}
