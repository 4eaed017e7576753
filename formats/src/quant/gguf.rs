//! GGUF block-quantized tensors (`gguf.<type>/1` objects: Q4_K, IQ2_XS,
//! MXFP4, ...) listed as dense tensors of their logical shape, so a
//! conversion writes them to any format: each row (the last dimension,
//! along which ggml's blocks run) dequantized to f32 by the kernels
//! `Tensor.dequantize` uses (`gguf::dequantize_blocks`, gguf-py's
//! `gguf.quants.dequantize` bit for bit) and rounded once to the output
//! type. A range decodes only the rows it covers, so a conversion holds one
//! tensor's output, not its f32 copy of the file. A block type gguf-py does
//! not dequantize is refused when the view is planned, before any output.

use std::sync::Arc;

use zt_core::error::{Context, Error, Result};
use zt_core::{DType, Limits, Object, Payload, Source};

use super::io::{self, output_width};
use super::units::{ByUnits, Units};
use super::{rules, Group};
use crate::gguf::{self, GgmlType};

/// One block-quantized tensor's decoder: `rows` rows of `row` values,
/// each `row_bytes` of blocks.
#[derive(Debug)]
struct GgufRows {
    blocks: Payload,
    ty: &'static GgmlType,
    rows: u64,
    row: u64,
    row_bytes: u64,
    to: DType,
}

/// Rows dequantized per call into f32: the f32 copy a decode holds beside
/// its output stays this small whatever the tensor's size.
const ROWS_BYTES: u64 = 8 << 20;

impl Units for GgufRows {
    const DESCRIBE: &'static str = "gguf-dequant";

    fn count(&self) -> u64 {
        self.rows
    }

    fn unit_bytes(&self) -> u64 {
        self.row * output_width(self.to).unwrap_or(4)
    }

    /// A chunk of rows at a time: read, dequantized to f32, stored as `to`.
    fn fill(&self, first: u64, out: &mut [u8], limits: &Limits) -> Result<()> {
        let row_out = self.unit_bytes();
        let count = out.len() as u64 / row_out;
        let per = (ROWS_BYTES / (self.row.max(1) * 4)).max(1);
        let mut at = 0u64;
        while at < count {
            let n = per.min(count - at);
            let blocks = io::read(
                &self.blocks,
                (first + at) * self.row_bytes,
                n * self.row_bytes,
                limits,
            )?;
            let values = gguf::dequantize_blocks(self.ty, &blocks)?;
            let o = &mut out[(at * row_out) as usize..((at + n) * row_out) as usize];
            io::store(self.to, &values, o);
            at += n;
        }
        Ok(())
    }
}

/// Every block-quantized tensor of `source` (a GGUF file's), each a group
/// whose object, under its own name and logical shape, decodes to `to`.
pub(super) fn plan(source: &Source, to: DType) -> Result<Vec<Group>> {
    let file = || io::first_file(source);
    let mut groups = Vec::new();
    for (at, t) in source.tensors().enumerate() {
        let Some(ty) = gguf::types::by_layout(t.layout()) else {
            continue;
        };
        let ctx = file().tensor(t.name());
        // No kernel for the type (gguf-py defines none): refused now, not
        // halfway through an output.
        gguf::dequantize_blocks(ty, &[]).map_err(|e| e.in_tensor(t.name()))?;
        let part = match t.object().parts.as_slice() {
            [part] => part,
            _ => {
                return Err(Error::header(
                    ctx,
                    rules::DTYPE,
                    "a GGUF block tensor of more than one part",
                ))
            }
        };
        let shape = t.shape().to_vec();
        let row = shape.last().copied().unwrap_or(1);
        if row % ty.elems_per_block != 0 {
            return Err(Error::header(
                ctx,
                rules::SCALE_SHAPE,
                format!(
                    "rows of {row} values are not whole {} blocks of {}",
                    ty.name, ty.elems_per_block
                ),
            ));
        }
        let row_bytes = row / ty.elems_per_block * ty.block_bytes;
        let lead = shape.split_last().map_or(&[][..], |(_, lead)| lead);
        let rows = zt_core::dtype::num_elements(lead);
        let (Some(rows), Some(width)) = (rows, output_width(to)) else {
            return Err(overflow(ctx, "row count"));
        };
        if rows.checked_mul(row_bytes) != Some(part.payload.len()) {
            return Err(Error::header(
                ctx,
                rules::SCALE_SHAPE,
                format!(
                    "{} bytes of {} blocks for {rows} rows of {row} values",
                    part.payload.len(),
                    ty.name
                ),
            ));
        }
        // The row's output too, on its own: an empty tensor (no rows) may
        // still declare rows too long to count in bytes.
        let row_out = row
            .checked_mul(width)
            .filter(|n| n.checked_mul(4).is_some());
        let decoded_len = rows.checked_mul(row).and_then(|n| n.checked_mul(width));
        let (Some(_), Some(decoded_len)) = (row_out, decoded_len) else {
            return Err(overflow(ctx, "dequantized size"));
        };
        let decoder = GgufRows {
            blocks: part.payload.clone(),
            ty,
            rows,
            row,
            row_bytes,
            to,
        };
        let object = Object::dense(
            t.name(),
            to,
            shape,
            Payload::Decoded {
                decoder: Arc::new(ByUnits(decoder)),
                decoded_len,
            },
        );
        groups.push(Group {
            at,
            reads: vec![at],
            object,
        });
    }
    Ok(groups)
}

fn overflow(ctx: Context, what: &'static str) -> Error {
    Error::Overflow {
        rule: zt_core::Rule::OVERFLOW,
        ctx,
        what,
    }
}
