//! The data the benchmarks write, generated in memory from fixed seeds.
//!
//! Tensor workloads are zTensor's (the same shapes as
//! `harness/write_bench.py`), synthetic random f32 bits as in the seed:
//! `large` (a few big matrices), `mixed` (realistic transformer shapes of
//! several sizes), `small` (10 KiB tensors, ~50k at 512 MiB).
//!
//! Record workloads are loaderx's shapes (as `harness/zrecord_bench.py`),
//! synthetic and labelled so: dense vision `uint8[3,224,224]` (modular
//! ramps, flat rectangles and 1/128 noise, so zstd sees image-like
//! redundancy) and dense token blocks `int32[512]` (Zipf-like ids below
//! 50,257, about as compressible as tokenized text).

use zt::container::write::ObjectIn;
use zt::{DType, TensorIn};

/// splitmix64: a small, fast, seedable generator.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, n)` (n > 0; the slight modulo bias is irrelevant here).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// Uniform in `(0, 1]`.
    pub fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    pub fn fill(&mut self, buf: &mut [u8]) {
        let mut chunks = buf.chunks_exact_mut(8);
        for c in &mut chunks {
            c.copy_from_slice(&self.next_u64().to_le_bytes());
        }
        let tail = self.next_u64().to_le_bytes();
        let rest = chunks.into_remainder();
        let n = rest.len();
        rest.copy_from_slice(&tail[..n]);
    }
}

/// The three tensor workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Large,
    Mixed,
    Small,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::Large, Kind::Mixed, Kind::Small];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Large => "large",
            Kind::Mixed => "mixed",
            Kind::Small => "small",
        }
    }

    pub fn parse(s: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == s)
    }

    /// Tensor shapes (f32) for about `size_mb` MiB, as write_bench.py.
    pub fn shapes(self, size_mb: u64) -> Vec<Vec<u64>> {
        let total = size_mb << 20;
        match self {
            Kind::Large => {
                let per = (total / 8).max(1 << 20);
                vec![vec![per / 4 / 4096, 4096]; (total / per).max(1) as usize]
            }
            Kind::Mixed => {
                let cycle: [&[u64]; 6] = [
                    &[2048, 2048],
                    &[512, 2048],
                    &[8192, 2048],
                    &[2048, 8192],
                    &[2048],
                    &[2048],
                ];
                let mut shapes = Vec::new();
                let mut used = 0;
                while used < total {
                    let s = cycle[shapes.len() % cycle.len()];
                    used += s.iter().product::<u64>() * 4;
                    shapes.push(s.to_vec());
                }
                shapes
            }
            Kind::Small => vec![vec![2560]; (total / 10240) as usize], // 10 KiB of f32
        }
    }
}

/// One tensor held in memory.
#[derive(Debug, Clone)]
pub struct Owned {
    pub name: String,
    pub shape: Vec<u64>,
    pub data: Vec<u8>,
}

/// A workload's tensors: f32 with random bits, named `t000000`, ….
#[derive(Debug, Clone)]
pub struct Tensors {
    pub kind: Kind,
    pub tensors: Vec<Owned>,
}

impl Tensors {
    pub fn generate(kind: Kind, size_mb: u64) -> Tensors {
        let mut rng = Rng::new(2);
        let tensors = kind
            .shapes(size_mb)
            .into_iter()
            .enumerate()
            .map(|(i, shape)| {
                let mut data = vec![0u8; shape.iter().product::<u64>() as usize * 4];
                rng.fill(&mut data);
                Owned {
                    name: format!("t{i:06}"),
                    shape,
                    data,
                }
            })
            .collect();
        Tensors { kind, tensors }
    }

    /// Bytes of tensor data.
    pub fn payload(&self) -> u64 {
        self.tensors.iter().map(|t| t.data.len() as u64).sum()
    }

    /// Writer inputs borrowing the data.
    pub fn inputs(&self) -> Vec<TensorIn<'_>> {
        self.tensors
            .iter()
            .map(|t| TensorIn {
                name: &t.name,
                dtype: DType::F32,
                shape: &t.shape,
                data: &t.data,
            })
            .collect()
    }

    /// `.zt` writer objects borrowing the data.
    pub fn objects(&self) -> Vec<ObjectIn<'_>> {
        self.tensors
            .iter()
            .map(|t| ObjectIn::dense(&t.name, DType::F32, &t.shape, &t.data))
            .collect()
    }

    /// Title line: tensor count and payload.
    pub fn describe(&self) -> String {
        format!(
            "{}: {} f32 tensors, {}",
            self.kind.name(),
            group(self.tensors.len() as u64),
            mib(self.payload())
        )
    }
}

/// A dense record workload: `n` records of `row` bytes, back to back.
#[derive(Debug, Clone)]
pub struct Records {
    pub name: &'static str,
    /// NumPy `dtype.str` of the store schema.
    pub dtype: &'static str,
    pub item_shape: Vec<u64>,
    pub row: usize,
    pub data: Vec<u8>,
}

impl Records {
    pub fn len(&self) -> u64 {
        (self.data.len() / self.row) as u64
    }

    /// Record `i`'s bytes.
    pub fn record(&self, i: u64) -> &[u8] {
        let at = i as usize * self.row;
        &self.data[at..at + self.row]
    }

    /// Dense vision records, CHW uint8 224×224, about `size_mb` MiB (at
    /// least one record).
    pub fn vision(size_mb: u64) -> Records {
        const SIDE: usize = 224;
        let row = 3 * SIDE * SIDE;
        let n = ((size_mb << 20) as usize / row).max(1);
        let mut rng = Rng::new(0);
        let mut data = vec![0u8; n * row];
        for (i, img) in data.chunks_exact_mut(row).enumerate() {
            for (c, plane) in img.chunks_exact_mut(SIDE * SIDE).enumerate() {
                for (p, px) in plane.iter_mut().enumerate() {
                    let (y, x) = (p / SIDE, p % SIDE);
                    *px = ((x * (c + 1) + y * (i % 7 + 1) + 17 * i) % 256) as u8;
                }
            }
            for _ in 0..4 {
                let (a, b) = (rng.below(200) as usize, rng.below(200) as usize);
                let colour = rng.next_u64().to_le_bytes();
                for (c, plane) in img.chunks_exact_mut(SIDE * SIDE).enumerate() {
                    for y in a..a + 24 {
                        plane[y * SIDE + b..y * SIDE + b + 24].fill(colour[c]);
                    }
                }
            }
            for p in 0..SIDE * SIDE {
                if rng.below(128) == 0 {
                    let v = rng.next_u64().to_le_bytes();
                    for c in 0..3 {
                        img[c * SIDE * SIDE + p] = v[c];
                    }
                }
            }
        }
        Records {
            name: "dense vision",
            dtype: "|u1",
            item_shape: vec![3, SIDE as u64, SIDE as u64],
            row,
            data,
        }
    }

    /// Dense token blocks, `int32[512]`, about `size_mb` MiB: ids drawn
    /// from a discretised power law with exponent 1.2 (Zipf-like), capped
    /// at GPT-2's largest id.
    pub fn token_blocks(size_mb: u64) -> Records {
        const BLOCK: usize = 512;
        let row = BLOCK * 4;
        let n = ((size_mb << 20) as usize / row).max(1);
        let mut rng = Rng::new(1);
        let mut data = Vec::with_capacity(n * row);
        for _ in 0..n * BLOCK {
            let id = rng.unit().powf(-1.0 / 0.2).min(50_256.0) as i32;
            data.extend_from_slice(&id.to_le_bytes());
        }
        Records {
            name: "dense token blocks",
            dtype: "<i4",
            item_shape: vec![BLOCK as u64],
            row,
            data,
        }
    }

    /// Title line: count, shape, logical size.
    pub fn describe(&self) -> String {
        let ty = if self.dtype == "|u1" {
            "uint8"
        } else {
            "int32"
        };
        format!(
            "{}: {} × {ty}{:?}, {}",
            self.name,
            group(self.len()),
            self.item_shape,
            mib(self.data.len() as u64)
        )
    }
}

/// `1234567` as `1,234,567`.
pub fn group(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Bytes as MiB with one decimal.
pub fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_follow_write_bench() {
        assert_eq!(Kind::Large.shapes(512), vec![vec![4096, 4096]; 8]);
        assert_eq!(Kind::Small.shapes(512).len(), 52_428);
        let mixed = Kind::Mixed.shapes(64);
        assert_eq!(mixed.len(), 3); // 16 + 4 + 64 MiB crosses 64 MiB
        assert_eq!(group(52_428), "52,428");
    }

    #[test]
    fn records_have_the_loaderx_shapes() {
        let v = Records::vision(1);
        assert_eq!((v.row, v.len()), (150_528, 6));
        let t = Records::token_blocks(1);
        assert_eq!((t.row, t.len()), (2048, 512));
        assert!(t
            .data
            .chunks_exact(4)
            .all(|b| (0..=50_256).contains(&i32::from_le_bytes(b.try_into().unwrap()))));
    }
}
