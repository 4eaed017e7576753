//! A restricted pickle machine: it interprets every opcode of protocols
//! 0-5 into an arena of inert [`Node`]s and executes nothing.
//!
//! `GLOBAL` / `STACK_GLOBAL` only record a module and a name; `REDUCE`,
//! `NEWOBJ`, `INST` and `OBJ` only record a call, unless the
//! [`Interpret`] hooks recognise the callable as data (a tensor rebuild, an
//! `OrderedDict`); `BUILD` only attaches state to an inert call. Nothing is
//! ever imported, looked up or called.
//!
//! Values live in one arena and the stack and memo hold indexes into it, so
//! `BINGET` of a large container costs one push, never a copy (the
//! quadratic blow-up of cloning memo entries), and a container that
//! contains itself is a cycle of indexes, not infinite memory. Every opcode,
//! object, memo entry and stack slot counts against [`Limits`].
//!
//! One file on purpose (about 1,000 lines of code, 100 of tests): the VM is
//! one `match` over pickle's opcode table, and splitting the opcodes across
//! files would hide which of them can reach the hooks.

use crate::pt::rules;
use std::collections::HashMap;
use zt_core::Rule;

use zt_core::error::{Context, Error, Result};
use zt_core::limits::Limits;

/// Index of a node in the arena.
pub type Id = u32;

/// One unpickled value.
#[derive(Debug, Clone)]
pub enum Node {
    /// `None`.
    None,
    /// A bool.
    Bool(bool),
    /// An int that fits in `i64`.
    Int(i64),
    /// A larger int: two's-complement little-endian bytes (from LONG1/LONG4
    /// as stored, from protocol 0's decimal INT/LONG converted).
    BigInt(Box<[u8]>),
    /// A float.
    Float(f64),
    /// A str.
    Str(Box<str>),
    /// bytes or bytearray.
    Bytes(Box<[u8]>),
    /// A list.
    List(Vec<Id>),
    /// A tuple.
    Tuple(Box<[Id]>),
    /// A dict (or `OrderedDict`), items in insertion order.
    Dict(Vec<(Id, Id)>),
    /// A set or frozenset.
    Set(Vec<Id>),
    /// A global reference (`module.name`), never imported.
    Global {
        /// The module.
        module: Box<str>,
        /// The attribute.
        name: Box<str>,
    },
    /// A call of something that was not interpreted: inert data.
    Call(Box<Call>),
    /// A value the interpreter understood (a storage, a tensor).
    Torch(Box<super::rebuild::Torch>),
}

/// An inert call (`REDUCE`, `NEWOBJ`, `INST`, `OBJ`) and what later
/// opcodes attached to its result.
#[derive(Debug, Clone, Default)]
pub struct Call {
    /// The callable (usually a [`Node::Global`]).
    pub callable: Id,
    /// The positional arguments (a tuple).
    pub args: Option<Id>,
    /// Keyword arguments (`NEWOBJ_EX`).
    pub kwargs: Option<Id>,
    /// The `BUILD` state, if any.
    pub state: Option<Id>,
    /// Items `SETITEM(S)` added (dict subclasses).
    pub items: Vec<(Id, Id)>,
    /// Items `APPEND(S)` / `ADDITEMS` added (list and set subclasses).
    pub list: Vec<Id>,
}

/// What an [`Interpret`] hook makes of a call or a persistent id.
#[derive(Debug)]
pub enum Outcome {
    /// A new node.
    Node(Node),
    /// An existing node (a `Parameter` is its data tensor).
    Same(Id),
    /// Not recognised: keep the call as an inert [`Node::Call`].
    Inert,
}

/// The hooks that turn known calls into data.
pub trait Interpret {
    /// Resolve a persistent id (`BINPERSID`, `PERSID`).
    fn persistent_load(&mut self, vm: &Vm, pid: Id) -> Result<Outcome>;
    /// Interpret `callable(*args)`; never executes anything.
    fn reduce(&mut self, vm: &Vm, callable: Id, args: Id) -> Result<Outcome>;
}

/// The arena, stack, memo and budgets of one or more pickle runs.
#[derive(Debug)]
pub struct Vm<'l> {
    nodes: Vec<Node>,
    limits: &'l Limits,
    ctx: Context,
    ops: u64,
}

/// Everything the hooks may look at: the arena, read only.
impl<'l> Vm<'l> {
    /// An empty machine.
    pub fn new(ctx: Context, limits: &'l Limits) -> Self {
        Vm {
            nodes: Vec::new(),
            limits,
            ctx,
            ops: 0,
        }
    }

    /// The node `id` points to.
    pub fn get(&self, id: Id) -> &Node {
        &self.nodes[id as usize]
    }

    /// Number of nodes built so far.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// True before anything is built.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The context errors carry.
    pub fn ctx(&self) -> &Context {
        &self.ctx
    }

    /// The limits in force.
    pub fn limits(&self) -> &Limits {
        self.limits
    }

    /// A str node's text.
    pub fn str(&self, id: Id) -> Option<&str> {
        match self.get(id) {
            Node::Str(s) => Some(s),
            _ => None,
        }
    }

    /// An int node's value.
    pub fn int(&self, id: Id) -> Option<i64> {
        match self.get(id) {
            Node::Int(i) => Some(*i),
            Node::Bool(b) => Some(i64::from(*b)),
            _ => None,
        }
    }

    /// A tuple (or list) node's items.
    pub fn items(&self, id: Id) -> Option<&[Id]> {
        match self.get(id) {
            Node::Tuple(t) => Some(t),
            Node::List(l) => Some(l),
            _ => None,
        }
    }

    /// A tuple node's items (call arguments must be tuples).
    pub fn tuple(&self, id: Id) -> Option<&[Id]> {
        match self.get(id) {
            Node::Tuple(t) => Some(t),
            _ => None,
        }
    }

    /// `(module, name)` of a global node.
    pub fn global(&self, id: Id) -> Option<(&str, &str)> {
        match self.get(id) {
            Node::Global { module, name } => Some((module, name)),
            _ => None,
        }
    }

    /// Add a node, counting it against `pickle_objects`.
    pub fn push_node(&mut self, node: Node) -> Result<Id> {
        let n = self.nodes.len() as u64;
        Limits::check(
            &self.ctx,
            "pickle_objects",
            n + 1,
            self.limits.pickle_objects,
        )?;
        self.nodes.push(node);
        Ok(n as Id)
    }

    /// Run one pickle from `data[start..]` to its `STOP`. Returns the
    /// unpickled value and the offset just past the `STOP`.
    pub fn run(
        &mut self,
        data: &[u8],
        start: usize,
        hooks: &mut dyn Interpret,
    ) -> Result<(Id, usize)> {
        let mut run = Run {
            data,
            pos: start,
            stack: Vec::new(),
            marks: Vec::new(),
            memo: HashMap::new(),
        };
        run.execute(self, hooks)
    }

    /// Count one unit of work against `pickle_ops` (opcodes and walk steps).
    pub fn tick(&mut self) -> Result<()> {
        self.ops += 1;
        if self.ops > self.limits.pickle_ops {
            return Err(Error::Limit {
                rule: Rule::LIMIT,
                ctx: self.ctx.clone(),
                limit: "pickle_ops",
                value: self.ops,
                max: self.limits.pickle_ops,
            });
        }
        Ok(())
    }

    fn node_mut(&mut self, id: Id) -> &mut Node {
        &mut self.nodes[id as usize]
    }
}

/// The state of one pickle run.
struct Run<'d> {
    data: &'d [u8],
    pos: usize,
    stack: Vec<Id>,
    /// Stack heights at each `MARK`.
    marks: Vec<usize>,
    memo: HashMap<u32, Id>,
}

mod op {
    pub const MARK: u8 = b'(';
    pub const STOP: u8 = b'.';
    pub const POP: u8 = b'0';
    pub const POP_MARK: u8 = b'1';
    pub const DUP: u8 = b'2';
    pub const FLOAT: u8 = b'F';
    pub const INT: u8 = b'I';
    pub const BININT: u8 = b'J';
    pub const BININT1: u8 = b'K';
    pub const LONG: u8 = b'L';
    pub const BININT2: u8 = b'M';
    pub const NONE: u8 = b'N';
    pub const PERSID: u8 = b'P';
    pub const BINPERSID: u8 = b'Q';
    pub const REDUCE: u8 = b'R';
    pub const STRING: u8 = b'S';
    pub const BINSTRING: u8 = b'T';
    pub const SHORT_BINSTRING: u8 = b'U';
    pub const UNICODE: u8 = b'V';
    pub const BINUNICODE: u8 = b'X';
    pub const APPEND: u8 = b'a';
    pub const BUILD: u8 = b'b';
    pub const GLOBAL: u8 = b'c';
    pub const DICT: u8 = b'd';
    pub const EMPTY_DICT: u8 = b'}';
    pub const APPENDS: u8 = b'e';
    pub const GET: u8 = b'g';
    pub const BINGET: u8 = b'h';
    pub const INST: u8 = b'i';
    pub const LONG_BINGET: u8 = b'j';
    pub const LIST: u8 = b'l';
    pub const EMPTY_LIST: u8 = b']';
    pub const OBJ: u8 = b'o';
    pub const PUT: u8 = b'p';
    pub const BINPUT: u8 = b'q';
    pub const LONG_BINPUT: u8 = b'r';
    pub const SETITEM: u8 = b's';
    pub const TUPLE: u8 = b't';
    pub const EMPTY_TUPLE: u8 = b')';
    pub const SETITEMS: u8 = b'u';
    pub const BINFLOAT: u8 = b'G';
    pub const PROTO: u8 = 0x80;
    pub const NEWOBJ: u8 = 0x81;
    pub const EXT1: u8 = 0x82;
    pub const EXT2: u8 = 0x83;
    pub const EXT4: u8 = 0x84;
    pub const TUPLE1: u8 = 0x85;
    pub const TUPLE2: u8 = 0x86;
    pub const TUPLE3: u8 = 0x87;
    pub const NEWTRUE: u8 = 0x88;
    pub const NEWFALSE: u8 = 0x89;
    pub const LONG1: u8 = 0x8a;
    pub const LONG4: u8 = 0x8b;
    pub const BINBYTES: u8 = b'B';
    pub const SHORT_BINBYTES: u8 = b'C';
    pub const SHORT_BINUNICODE: u8 = 0x8c;
    pub const BINUNICODE8: u8 = 0x8d;
    pub const BINBYTES8: u8 = 0x8e;
    pub const EMPTY_SET: u8 = 0x8f;
    pub const ADDITEMS: u8 = 0x90;
    pub const FROZENSET: u8 = 0x91;
    pub const NEWOBJ_EX: u8 = 0x92;
    pub const STACK_GLOBAL: u8 = 0x93;
    pub const MEMOIZE: u8 = 0x94;
    pub const FRAME: u8 = 0x95;
    pub const BYTEARRAY8: u8 = 0x96;
    pub const NEXT_BUFFER: u8 = 0x97;
    pub const READONLY_BUFFER: u8 = 0x98;
}

impl<'d> Run<'d> {
    fn err(&self, vm: &Vm, at: usize, reason: impl Into<String>) -> Error {
        Error::header(
            vm.ctx.clone(),
            rules::PICKLE,
            format!("pickle byte {at}: {}", reason.into()),
        )
    }

    fn take(&mut self, vm: &Vm, n: u64, what: &'static str) -> Result<&'d [u8]> {
        let available = (self.data.len() - self.pos) as u64;
        if n > available {
            return Err(Error::Truncated {
                rule: Rule::TRUNCATED,
                ctx: vm.ctx.clone(),
                what,
                needed: n,
                available,
            });
        }
        let s = &self.data[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn byte(&mut self, vm: &Vm, what: &'static str) -> Result<u8> {
        Ok(self.take(vm, 1, what)?[0])
    }

    fn le(&mut self, vm: &Vm, n: u64, what: &'static str) -> Result<u64> {
        let b = self.take(vm, n, what)?;
        Ok(b.iter()
            .rev()
            .fold(0u64, |acc, &x| (acc << 8) | u64::from(x)))
    }

    /// A `\n`-terminated line (protocol 0 arguments), without the newline.
    fn line(&mut self, vm: &Vm, what: &'static str) -> Result<&'d [u8]> {
        let rest = &self.data[self.pos..];
        let max = vm.limits.string_bytes.min(rest.len() as u64) as usize;
        match rest[..max].iter().position(|&b| b == b'\n') {
            Some(n) => {
                self.pos += n + 1;
                Ok(&rest[..n])
            }
            None if max < rest.len() => Err(Error::Limit {
                rule: Rule::LIMIT,
                ctx: vm.ctx.clone(),
                limit: "string_bytes",
                value: rest.len() as u64,
                max: vm.limits.string_bytes,
            }),
            None => Err(Error::Truncated {
                rule: Rule::TRUNCATED,
                ctx: vm.ctx.clone(),
                what,
                needed: rest.len() as u64 + 1,
                available: rest.len() as u64,
            }),
        }
    }

    fn push(&mut self, vm: &Vm, id: Id) -> Result<()> {
        let depth = (self.stack.len() + self.marks.len()) as u64 + 1;
        Limits::check(&vm.ctx, "pickle_stack", depth, vm.limits.pickle_stack)?;
        self.stack.push(id);
        Ok(())
    }

    fn push_new(&mut self, vm: &mut Vm, node: Node) -> Result<()> {
        let id = vm.push_node(node)?;
        self.push(vm, id)
    }

    fn pop(&mut self, vm: &Vm, at: usize) -> Result<Id> {
        match self.marks.last() {
            Some(&m) if self.stack.len() <= m => Err(self.err(vm, at, "pop across a MARK")),
            _ => self
                .stack
                .pop()
                .ok_or_else(|| self.err(vm, at, "stack underflow")),
        }
    }

    fn top(&self, vm: &Vm, at: usize) -> Result<Id> {
        match self.marks.last() {
            Some(&m) if self.stack.len() <= m => Err(self.err(vm, at, "no value above the MARK")),
            _ => self
                .stack
                .last()
                .copied()
                .ok_or_else(|| self.err(vm, at, "stack underflow")),
        }
    }

    /// Pop everything above the last `MARK`, and the mark.
    fn pop_mark(&mut self, vm: &Vm, at: usize) -> Result<Vec<Id>> {
        let m = self
            .marks
            .pop()
            .ok_or_else(|| self.err(vm, at, "no MARK on the stack"))?;
        Ok(self.stack.split_off(m))
    }

    fn memo_put(&mut self, vm: &Vm, index: u64, at: usize) -> Result<()> {
        let index =
            u32::try_from(index).map_err(|_| self.err(vm, at, format!("memo index {index}")))?;
        let id = self.top(vm, at)?;
        if self.memo.insert(index, id).is_none() {
            Limits::check(
                &vm.ctx,
                "pickle_memo",
                self.memo.len() as u64,
                vm.limits.pickle_memo,
            )?;
        }
        Ok(())
    }

    fn memo_get(&mut self, vm: &Vm, index: u64, at: usize) -> Result<()> {
        let id = u32::try_from(index)
            .ok()
            .and_then(|i| self.memo.get(&i).copied())
            .ok_or_else(|| self.err(vm, at, format!("memo has no entry {index}")))?;
        self.push(vm, id)
    }

    fn execute(&mut self, vm: &mut Vm, hooks: &mut dyn Interpret) -> Result<(Id, usize)> {
        loop {
            vm.tick()?;
            let at = self.pos;
            let code = self.byte(vm, "pickle opcode")?;
            match code {
                op::STOP => {
                    let id = self.pop(vm, at)?;
                    return Ok((id, self.pos));
                }
                op::PROTO => {
                    let v = self.byte(vm, "PROTO")?;
                    if v > 5 {
                        return Err(self.err(vm, at, format!("pickle protocol {v}")));
                    }
                }
                op::FRAME => {
                    // Framing only groups opcodes for buffered reads.
                    self.take(vm, 8, "FRAME")?;
                }
                op::MARK => {
                    let depth = (self.stack.len() + self.marks.len()) as u64 + 1;
                    Limits::check(&vm.ctx, "pickle_stack", depth, vm.limits.pickle_stack)?;
                    self.marks.push(self.stack.len());
                }
                op::POP => {
                    if self.marks.last() == Some(&self.stack.len()) {
                        self.pop_mark(vm, at)?;
                    } else {
                        self.pop(vm, at)?;
                    }
                }
                op::POP_MARK => {
                    self.pop_mark(vm, at)?;
                }
                op::DUP => {
                    let id = self.top(vm, at)?;
                    self.push(vm, id)?;
                }
                op::NONE => self.push_new(vm, Node::None)?,
                op::NEWTRUE => self.push_new(vm, Node::Bool(true))?,
                op::NEWFALSE => self.push_new(vm, Node::Bool(false))?,
                op::BININT => {
                    let v = self.le(vm, 4, "BININT")? as u32 as i32;
                    self.push_new(vm, Node::Int(i64::from(v)))?;
                }
                op::BININT1 => {
                    let v = self.byte(vm, "BININT1")?;
                    self.push_new(vm, Node::Int(i64::from(v)))?;
                }
                op::BININT2 => {
                    let v = self.le(vm, 2, "BININT2")?;
                    self.push_new(vm, Node::Int(v as i64))?;
                }
                op::LONG1 => {
                    let n = self.byte(vm, "LONG1")?;
                    let b = self.take(vm, u64::from(n), "LONG1")?;
                    self.push_new(vm, long_node(b))?;
                }
                op::LONG4 => {
                    let n = self.le(vm, 4, "LONG4")? as u32 as i32;
                    if n < 0 {
                        return Err(self.err(vm, at, "LONG4 with a negative length"));
                    }
                    let b = self.take(vm, n as u64, "LONG4")?;
                    self.push_new(vm, long_node(b))?;
                }
                op::INT => {
                    let line = self.line(vm, "INT")?;
                    let node = match line {
                        b"00" => Node::Bool(false),
                        b"01" => Node::Bool(true),
                        _ => text_int(line).ok_or_else(|| self.err(vm, at, "bad INT"))?,
                    };
                    self.push_new(vm, node)?;
                }
                op::LONG => {
                    let line = self.line(vm, "LONG")?;
                    let line = line.strip_suffix(b"L").unwrap_or(line);
                    let node = text_int(line).ok_or_else(|| self.err(vm, at, "bad LONG"))?;
                    self.push_new(vm, node)?;
                }
                op::BINFLOAT => {
                    let b = self.take(vm, 8, "BINFLOAT")?;
                    let v = f64::from_be_bytes(b.try_into().expect("8 bytes"));
                    self.push_new(vm, Node::Float(v))?;
                }
                op::FLOAT => {
                    let line = self.line(vm, "FLOAT")?;
                    let v = std::str::from_utf8(line)
                        .ok()
                        .and_then(|s| s.trim().parse::<f64>().ok())
                        .ok_or_else(|| self.err(vm, at, "bad FLOAT"))?;
                    self.push_new(vm, Node::Float(v))?;
                }
                op::BINUNICODE | op::SHORT_BINUNICODE | op::BINUNICODE8 => {
                    let width = match code {
                        op::SHORT_BINUNICODE => 1,
                        op::BINUNICODE => 4,
                        _ => 8,
                    };
                    let n = self.le(vm, width, "string length")?;
                    let b = self.take(vm, n, "string")?;
                    let s = String::from_utf8_lossy(b).into_owned().into_boxed_str();
                    self.push_new(vm, Node::Str(s))?;
                }
                op::BINSTRING | op::SHORT_BINSTRING => {
                    let n = if code == op::BINSTRING {
                        let n = self.le(vm, 4, "BINSTRING")? as u32 as i32;
                        if n < 0 {
                            return Err(self.err(vm, at, "BINSTRING with a negative length"));
                        }
                        n as u64
                    } else {
                        u64::from(self.byte(vm, "SHORT_BINSTRING")?)
                    };
                    let b = self.take(vm, n, "string")?;
                    // Python 2 byte strings: read as latin-1, as torch does
                    // for old checkpoints.
                    self.push_new(vm, Node::Str(latin1(b)))?;
                }
                op::BINBYTES | op::SHORT_BINBYTES | op::BINBYTES8 | op::BYTEARRAY8 => {
                    let width = match code {
                        op::SHORT_BINBYTES => 1,
                        op::BINBYTES => 4,
                        _ => 8,
                    };
                    let n = self.le(vm, width, "bytes length")?;
                    let b = self.take(vm, n, "bytes")?;
                    self.push_new(vm, Node::Bytes(b.into()))?;
                }
                op::STRING => {
                    let line = self.line(vm, "STRING")?;
                    let s = unquote(line).ok_or_else(|| self.err(vm, at, "bad STRING"))?;
                    self.push_new(vm, Node::Str(latin1(&s)))?;
                }
                op::UNICODE => {
                    let line = self.line(vm, "UNICODE")?;
                    let s =
                        raw_unicode_escape(line).ok_or_else(|| self.err(vm, at, "bad UNICODE"))?;
                    self.push_new(vm, Node::Str(s))?;
                }
                op::EMPTY_LIST => self.push_new(vm, Node::List(Vec::new()))?,
                op::EMPTY_DICT => self.push_new(vm, Node::Dict(Vec::new()))?,
                op::EMPTY_TUPLE => self.push_new(vm, Node::Tuple(Box::new([])))?,
                op::EMPTY_SET => self.push_new(vm, Node::Set(Vec::new()))?,
                op::LIST => {
                    let items = self.pop_mark(vm, at)?;
                    self.push_new(vm, Node::List(items))?;
                }
                op::TUPLE => {
                    let items = self.pop_mark(vm, at)?;
                    self.push_new(vm, Node::Tuple(items.into()))?;
                }
                op::FROZENSET => {
                    let items = self.pop_mark(vm, at)?;
                    self.push_new(vm, Node::Set(items))?;
                }
                op::TUPLE1 | op::TUPLE2 | op::TUPLE3 => {
                    let n = usize::from(code - op::TUPLE1 + 1);
                    let mut items = vec![0; n];
                    for slot in items.iter_mut().rev() {
                        *slot = self.pop(vm, at)?;
                    }
                    self.push_new(vm, Node::Tuple(items.into()))?;
                }
                op::DICT => {
                    let items = self.pop_mark(vm, at)?;
                    if items.len() % 2 != 0 {
                        return Err(self.err(vm, at, "DICT with an odd number of items"));
                    }
                    let pairs = items.chunks_exact(2).map(|p| (p[0], p[1])).collect();
                    self.push_new(vm, Node::Dict(pairs))?;
                }
                op::APPEND => {
                    let value = self.pop(vm, at)?;
                    let target = self.top(vm, at)?;
                    self.append(vm, target, &[value], at)?;
                }
                op::APPENDS | op::ADDITEMS => {
                    let items = self.pop_mark(vm, at)?;
                    let target = self.top(vm, at)?;
                    self.append(vm, target, &items, at)?;
                }
                op::SETITEM => {
                    let value = self.pop(vm, at)?;
                    let key = self.pop(vm, at)?;
                    let target = self.top(vm, at)?;
                    self.set_items(vm, target, &[key, value], at)?;
                }
                op::SETITEMS => {
                    let items = self.pop_mark(vm, at)?;
                    if items.len() % 2 != 0 {
                        return Err(self.err(vm, at, "SETITEMS with an odd number of items"));
                    }
                    let target = self.top(vm, at)?;
                    self.set_items(vm, target, &items, at)?;
                }
                op::BINPUT => {
                    let i = u64::from(self.byte(vm, "BINPUT")?);
                    self.memo_put(vm, i, at)?;
                }
                op::LONG_BINPUT => {
                    let i = self.le(vm, 4, "LONG_BINPUT")?;
                    self.memo_put(vm, i, at)?;
                }
                op::PUT => {
                    let line = self.line(vm, "PUT")?;
                    let i = decimal(line).ok_or_else(|| self.err(vm, at, "bad PUT index"))?;
                    self.memo_put(vm, i, at)?;
                }
                op::MEMOIZE => {
                    // CPython stores at `len(memo)`.
                    let i = self.memo.len() as u64;
                    self.memo_put(vm, i, at)?;
                }
                op::BINGET => {
                    let i = u64::from(self.byte(vm, "BINGET")?);
                    self.memo_get(vm, i, at)?;
                }
                op::LONG_BINGET => {
                    let i = self.le(vm, 4, "LONG_BINGET")?;
                    self.memo_get(vm, i, at)?;
                }
                op::GET => {
                    let line = self.line(vm, "GET")?;
                    let i = decimal(line).ok_or_else(|| self.err(vm, at, "bad GET index"))?;
                    self.memo_get(vm, i, at)?;
                }
                op::GLOBAL => {
                    let module = self.line(vm, "GLOBAL module")?;
                    let name = self.line(vm, "GLOBAL name")?;
                    let node = global_node(module, name);
                    self.push_new(vm, node)?;
                }
                op::STACK_GLOBAL => {
                    let name = self.pop(vm, at)?;
                    let module = self.pop(vm, at)?;
                    let (Some(module), Some(name)) = (vm.str(module), vm.str(name)) else {
                        return Err(self.err(vm, at, "STACK_GLOBAL of a non-string"));
                    };
                    let node = global_node(module.as_bytes(), name.as_bytes());
                    self.push_new(vm, node)?;
                }
                op::INST => {
                    let module = self.line(vm, "INST module")?;
                    let name = self.line(vm, "INST name")?;
                    let args = self.pop_mark(vm, at)?;
                    let callable = vm.push_node(global_node(module, name))?;
                    let args = vm.push_node(Node::Tuple(args.into()))?;
                    self.call(vm, hooks, callable, args, None)?;
                }
                op::OBJ => {
                    let mut items = self.pop_mark(vm, at)?;
                    if items.is_empty() {
                        return Err(self.err(vm, at, "OBJ without a class"));
                    }
                    let callable = items.remove(0);
                    let args = vm.push_node(Node::Tuple(items.into()))?;
                    self.call(vm, hooks, callable, args, None)?;
                }
                op::REDUCE | op::NEWOBJ => {
                    let args = self.pop(vm, at)?;
                    let callable = self.pop(vm, at)?;
                    self.call(vm, hooks, callable, args, None)?;
                }
                op::NEWOBJ_EX => {
                    let kwargs = self.pop(vm, at)?;
                    let args = self.pop(vm, at)?;
                    let callable = self.pop(vm, at)?;
                    self.call(vm, hooks, callable, args, Some(kwargs))?;
                }
                op::BUILD => {
                    let state = self.pop(vm, at)?;
                    let target = self.top(vm, at)?;
                    self.build(vm, target, state, at)?;
                }
                op::BINPERSID => {
                    let pid = self.pop(vm, at)?;
                    self.persistent(vm, hooks, pid)?;
                }
                op::PERSID => {
                    let line = self.line(vm, "PERSID")?;
                    let pid = vm.push_node(Node::Str(latin1(line)))?;
                    self.persistent(vm, hooks, pid)?;
                }
                op::EXT1 | op::EXT2 | op::EXT4 => {
                    let width = match code {
                        op::EXT1 => 1,
                        op::EXT2 => 2,
                        _ => 4,
                    };
                    let code = self.le(vm, width, "EXT")?;
                    // The copyreg extension registry is process state we do
                    // not have; the reference stays an inert global.
                    let node = Node::Global {
                        module: "copyreg._extension_registry".into(),
                        name: code.to_string().into(),
                    };
                    self.push_new(vm, node)?;
                }
                op::NEXT_BUFFER => {
                    return Err(self.err(vm, at, "out-of-band buffers (NEXT_BUFFER)"));
                }
                op::READONLY_BUFFER => {
                    self.top(vm, at)?;
                }
                other => {
                    return Err(self.err(vm, at, format!("unknown opcode {other:#04x}")));
                }
            }
        }
    }

    fn call(
        &mut self,
        vm: &mut Vm,
        hooks: &mut dyn Interpret,
        callable: Id,
        args: Id,
        kwargs: Option<Id>,
    ) -> Result<()> {
        match hooks.reduce(vm, callable, args)? {
            Outcome::Node(node) => self.push_new(vm, node),
            Outcome::Same(id) => self.push(vm, id),
            Outcome::Inert => self.push_new(
                vm,
                Node::Call(Box::new(Call {
                    callable,
                    args: Some(args),
                    kwargs,
                    ..Call::default()
                })),
            ),
        }
    }

    fn persistent(&mut self, vm: &mut Vm, hooks: &mut dyn Interpret, pid: Id) -> Result<()> {
        match hooks.persistent_load(vm, pid)? {
            Outcome::Node(node) => self.push_new(vm, node),
            Outcome::Same(id) => self.push(vm, id),
            Outcome::Inert => Err(Error::header(
                vm.ctx.clone(),
                rules::OBJECT,
                "a persistent id that is not a storage",
            )),
        }
    }

    fn append(&mut self, vm: &mut Vm, target: Id, items: &[Id], at: usize) -> Result<()> {
        match vm.node_mut(target) {
            Node::List(l) | Node::Set(l) => l.extend_from_slice(items),
            Node::Call(c) => c.list.extend_from_slice(items),
            other => {
                let kind = kind(other);
                return Err(self.err(vm, at, format!("APPEND to a {kind}")));
            }
        }
        Ok(())
    }

    fn set_items(&mut self, vm: &mut Vm, target: Id, items: &[Id], at: usize) -> Result<()> {
        let pairs = items.chunks_exact(2).map(|p| (p[0], p[1]));
        match vm.node_mut(target) {
            Node::Dict(d) => d.extend(pairs),
            Node::Call(c) => c.items.extend(pairs),
            other => {
                let kind = kind(other);
                return Err(self.err(vm, at, format!("SETITEM on a {kind}")));
            }
        }
        Ok(())
    }

    /// `BUILD`: attach the state to an inert call. State on a dict
    /// (`OrderedDict._metadata`) or a tensor (legacy `set_` state) is
    /// attribute data that holds no tensors of its own, so it is dropped,
    /// as `torch.load(weights_only=True)` drops it from the mapping.
    fn build(&mut self, vm: &mut Vm, target: Id, state: Id, at: usize) -> Result<()> {
        match vm.node_mut(target) {
            Node::Call(c) => {
                c.state = Some(state);
                Ok(())
            }
            Node::Dict(_) | Node::Torch(_) => Ok(()),
            other => {
                let kind = kind(other);
                Err(self.err(vm, at, format!("BUILD on a {kind}")))
            }
        }
    }
}

/// A short name for a node's kind, for errors.
pub fn kind(node: &Node) -> &'static str {
    match node {
        Node::None => "None",
        Node::Bool(_) => "bool",
        Node::Int(_) | Node::BigInt(_) => "int",
        Node::Float(_) => "float",
        Node::Str(_) => "str",
        Node::Bytes(_) => "bytes",
        Node::List(_) => "list",
        Node::Tuple(_) => "tuple",
        Node::Dict(_) => "dict",
        Node::Set(_) => "set",
        Node::Global { .. } => "global",
        Node::Call(_) => "object",
        Node::Torch(_) => "tensor",
    }
}

/// Python 2 module names that Python 3's unpickler remaps (the subset that
/// matters for recognising globals).
fn global_node(module: &[u8], name: &[u8]) -> Node {
    let module = String::from_utf8_lossy(module);
    let module = match module.as_ref() {
        "__builtin__" => "builtins",
        "copy_reg" => "copyreg",
        other => other,
    };
    Node::Global {
        module: module.into(),
        name: String::from_utf8_lossy(name).into(),
    }
}

/// A two's-complement little-endian integer of any length.
fn long_node(b: &[u8]) -> Node {
    if b.is_empty() {
        return Node::Int(0);
    }
    if b.len() <= 8 {
        let negative = b[b.len() - 1] & 0x80 != 0;
        let mut v: u64 = if negative { u64::MAX } else { 0 };
        for (i, &x) in b.iter().enumerate() {
            v &= !(0xFFu64 << (8 * i));
            v |= u64::from(x) << (8 * i);
        }
        return Node::Int(v as i64);
    }
    Node::BigInt(b.into())
}

/// A decimal integer line (protocol 0 `INT` / `LONG`).
fn text_int(line: &[u8]) -> Option<Node> {
    let s = std::str::from_utf8(line).ok()?.trim();
    if let Ok(v) = s.parse::<i64>() {
        return Some(Node::Int(v));
    }
    // Too large for i64: the same two's-complement bytes a binary LONG
    // holds, so a big int reads the same whatever the protocol.
    let (negative, digits) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    // Python refuses more than 4300 digits (sys.int_info.default_max_str_digits);
    // the bound also keeps the quadratic conversion below cheap.
    if digits.is_empty() || digits.len() > 4300 || !digits.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    Some(Node::BigInt(twos_complement_le(digits, negative).into()))
}

/// Little-endian two's-complement bytes of a decimal magnitude and sign,
/// as short as they can be (with a sign bit), as pickle's LONG1 stores them.
fn twos_complement_le(digits: &str, negative: bool) -> Vec<u8> {
    // The magnitude in base 256, least significant first.
    let mut bytes: Vec<u8> = vec![0];
    for d in digits.bytes() {
        let mut carry = u32::from(d - b'0');
        for b in bytes.iter_mut() {
            let v = u32::from(*b) * 10 + carry;
            *b = v as u8;
            carry = v >> 8;
        }
        while carry > 0 {
            bytes.push(carry as u8);
            carry >>= 8;
        }
    }
    if negative {
        // Two's complement: invert and add one.
        let mut carry = true;
        for b in bytes.iter_mut() {
            let (v, c) = (!*b).overflowing_add(u8::from(carry));
            *b = v;
            carry = c;
        }
    }
    // Keep exactly one byte of sign.
    let sign = if negative { 0xFF } else { 0x00 };
    while bytes.len() > 1
        && bytes[bytes.len() - 1] == sign
        && (bytes[bytes.len() - 2] & 0x80 == sign & 0x80)
    {
        bytes.pop();
    }
    if bytes[bytes.len() - 1] & 0x80 != sign & 0x80 {
        bytes.push(sign);
    }
    bytes
}

fn decimal(line: &[u8]) -> Option<u64> {
    std::str::from_utf8(line).ok()?.trim().parse().ok()
}

fn latin1(b: &[u8]) -> Box<str> {
    b.iter().map(|&c| char::from(c)).collect::<String>().into()
}

/// Undo the `repr` quoting of a protocol 0 `STRING` argument.
fn unquote(line: &[u8]) -> Option<Vec<u8>> {
    let q = *line.first()?;
    if line.len() < 2 || (q != b'\'' && q != b'"') || *line.last()? != q {
        return None;
    }
    let body = &line[1..line.len() - 1];
    let mut out = Vec::with_capacity(body.len());
    let mut i = 0;
    while i < body.len() {
        let c = body[i];
        i += 1;
        if c != b'\\' {
            out.push(c);
            continue;
        }
        let e = *body.get(i)?;
        i += 1;
        match e {
            b'n' => out.push(b'\n'),
            b't' => out.push(b'\t'),
            b'r' => out.push(b'\r'),
            b'a' => out.push(7),
            b'b' => out.push(8),
            b'f' => out.push(12),
            b'v' => out.push(11),
            b'\\' | b'\'' | b'"' => out.push(e),
            b'x' => {
                let h = std::str::from_utf8(body.get(i..i + 2)?).ok()?;
                out.push(u8::from_str_radix(h, 16).ok()?);
                i += 2;
            }
            b'0'..=b'7' => {
                let mut v = u32::from(e - b'0');
                for _ in 0..2 {
                    match body.get(i) {
                        Some(&d @ b'0'..=b'7') => {
                            v = v * 8 + u32::from(d - b'0');
                            i += 1;
                        }
                        _ => break,
                    }
                }
                out.push(v as u8);
            }
            other => {
                out.push(b'\\');
                out.push(other);
            }
        }
    }
    Some(out)
}

/// Decode Python's `raw-unicode-escape` (protocol 0 `UNICODE`).
fn raw_unicode_escape(line: &[u8]) -> Option<Box<str>> {
    let mut out = String::with_capacity(line.len());
    let mut i = 0;
    while i < line.len() {
        let c = line[i];
        if c == b'\\' && matches!(line.get(i + 1), Some(b'u') | Some(b'U')) {
            let n = if line[i + 1] == b'u' { 4 } else { 8 };
            let h = std::str::from_utf8(line.get(i + 2..i + 2 + n)?).ok()?;
            out.push(char::from_u32(u32::from_str_radix(h, 16).ok()?).unwrap_or('\u{fffd}'));
            i += 2 + n;
        } else {
            out.push(char::from(c));
            i += 1;
        }
    }
    Some(out.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hooks that interpret nothing.
    struct Plain;

    impl Interpret for Plain {
        fn persistent_load(&mut self, _: &Vm, pid: Id) -> Result<Outcome> {
            Ok(Outcome::Same(pid))
        }
        fn reduce(&mut self, _: &Vm, _: Id, _: Id) -> Result<Outcome> {
            Ok(Outcome::Inert)
        }
    }

    fn run<'a>(data: &[u8], limits: &'a Limits) -> Result<(Vm<'a>, Id)> {
        // Leak-free: the limits outlive the machine in each test.
        let mut vm = Vm::new(Context::default(), limits);
        let (id, _) = vm.run(data, 0, &mut Plain)?;
        Ok((vm, id))
    }

    #[test]
    fn longs_sign_extend() {
        assert!(matches!(long_node(&[0xff]), Node::Int(-1)));
        assert!(matches!(long_node(&[0x00, 0x80]), Node::Int(-32768)));
        assert!(matches!(long_node(&[0xff, 0x00]), Node::Int(255)));
        assert!(matches!(long_node(&[1; 9]), Node::BigInt(_)));
        // Protocol 0's decimal digits become the bytes LONG1 would hold.
        let big = |text: &str| match text_int(text.as_bytes()) {
            Some(Node::BigInt(b)) => b.into_vec(),
            other => panic!("{text}: {other:?}"),
        };
        assert_eq!(big("18446744073709551616"), [0, 0, 0, 0, 0, 0, 0, 0, 1]); // 2^64
        assert_eq!(
            big("-9223372036854775809"),
            [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0xff]
        ); // -2^63-1
        assert_eq!(big("9223372036854775808"), [0, 0, 0, 0, 0, 0, 0, 0x80, 0]); // 2^63
        assert!(
            text_int("1".repeat(4301).as_bytes()).is_none(),
            "more digits than Python reads"
        );
        assert!(matches!(long_node(&[]), Node::Int(0)));
    }

    #[test]
    fn protocol_0_text() {
        assert_eq!(unquote(b"'a\\nb\\x41\\101'").unwrap(), b"a\nbAA");
        assert_eq!(&*raw_unicode_escape(b"caf\\u00e9").unwrap(), "café");
        let limits = Limits::default();
        // (lp0\nI1\naI-2\naS'x'\np1\na.  == [1, -2, 'x']
        let (vm, id) = run(b"(lp0\nI1\naI-2\naS'x'\np1\na.", &limits).unwrap();
        let items = vm.items(id).unwrap().to_vec();
        assert_eq!(vm.int(items[0]), Some(1));
        assert_eq!(vm.int(items[1]), Some(-2));
        assert_eq!(vm.str(items[2]), Some("x"));
    }

    #[test]
    fn memo_shares_instead_of_copying() {
        let limits = Limits::default();
        // A list that contains itself: ]q\x00h\x00a.
        let (vm, id) = run(b"\x80\x02]q\x00h\x00a.", &limits).unwrap();
        assert_eq!(vm.items(id).unwrap(), &[id]);
    }

    #[test]
    fn limits_hold() {
        let small = Limits {
            pickle_stack: 4,
            ..Limits::default()
        };
        assert!(matches!(
            run(b"(((((((.", &small),
            Err(Error::Limit {
                limit: "pickle_stack",
                ..
            })
        ));
        let few = Limits {
            pickle_ops: 3,
            ..Limits::default()
        };
        assert!(matches!(
            run(b"NNNNN.", &few),
            Err(Error::Limit {
                limit: "pickle_ops",
                ..
            })
        ));
        assert!(matches!(
            run(b"\x80\x02X\xff\xff\xff\x00", &Limits::default()),
            Err(Error::Truncated { .. })
        ));
        assert!(matches!(
            run(b"h\x05.", &Limits::default()),
            Err(Error::Header { .. })
        ));
        assert!(matches!(
            run(b")Ns.", &Limits::default()),
            Err(Error::Header { .. })
        ));
    }
}
