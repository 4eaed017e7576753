//! The group tree a file's names make: `a/b/c` is the dataset `c` in the
//! group `b` in the group `a`, as the reader names datasets. File
//! attributes land where the reader finds them: `name` on the root group,
//! `g/h/name` on the group `g/h` (made if no dataset is in it).

use std::collections::BTreeMap;

use zt_core::catalog::Value;
use zt_core::error::{Context, Error, Result};

use crate::h5::rules;

/// A group: its members by name (links are listed by name, as libhdf5
/// and h5py iterate them), and its attributes.
#[derive(Default)]
pub struct Group<'t> {
    pub members: BTreeMap<&'t str, Node<'t>>,
    pub attributes: Vec<(&'t str, &'t Value)>,
}

/// A member: a group, or the dataset of the tensor at this index.
pub enum Node<'t> {
    Group(Group<'t>),
    Dataset(usize),
}

/// The components of `name` as HDF5 link names: none empty, `.` or
/// holding a NUL (the reader would name the dataset otherwise).
fn components<'t>(ctx: &Context, name: &'t str, what: &str) -> Result<Vec<&'t str>> {
    let parts: Vec<&str> = name.split('/').collect();
    if parts
        .iter()
        .any(|p| p.is_empty() || *p == "." || p.contains('\0'))
    {
        return Err(Error::Write {
            rule: rules::NAME,
            ctx: ctx.clone().tensor(name),
            reason: format!(
                "an HDF5 {what} is named by its path: `/`-separated, no empty component, \
                 no leading or trailing `/`, no `.` component and no NUL"
            ),
        });
    }
    if parts.iter().any(|p| p.len() > u16::MAX as usize - 16) {
        return Err(Error::Write {
            rule: rules::NAME,
            ctx: ctx.clone().tensor(name),
            reason: "a path component longer than a link message holds".into(),
        });
    }
    Ok(parts)
}

impl<'t> Group<'t> {
    /// The group at `path` below this one, made where missing; `None` when
    /// a dataset is in the way.
    fn group_mut(&mut self, path: &[&'t str]) -> Option<&mut Group<'t>> {
        let Some((first, rest)) = path.split_first() else {
            return Some(self);
        };
        match self
            .members
            .entry(first)
            .or_insert_with(|| Node::Group(Group::default()))
        {
            Node::Group(g) => g.group_mut(rest),
            Node::Dataset(_) => None,
        }
    }

    /// Add the dataset `name` (tensor `index`).
    pub fn insert(&mut self, ctx: &Context, name: &'t str, index: usize) -> Result<()> {
        let parts = components(ctx, name, "dataset")?;
        let (leaf, dirs) = parts.split_last().expect("split gives one part");
        let clash = |why: &str| Error::Write {
            rule: rules::NAME,
            ctx: ctx.clone().tensor(name),
            reason: why.to_string(),
        };
        let group = self
            .group_mut(dirs)
            .ok_or_else(|| clash("a dataset's path runs through another dataset"))?;
        match group.members.entry(leaf) {
            std::collections::btree_map::Entry::Occupied(e) => match e.get() {
                Node::Dataset(_) => Err(Error::DuplicateName {
                    ctx: ctx.clone().tensor(name),
                }),
                Node::Group(_) => Err(clash("a name is both a dataset and a group")),
            },
            std::collections::btree_map::Entry::Vacant(e) => {
                e.insert(Node::Dataset(index));
                Ok(())
            }
        }
    }

    /// Attach the file attribute `key` (`name` or `group/path/name`).
    pub fn attribute(&mut self, ctx: &Context, key: &'t str, value: &'t Value) -> Result<()> {
        let parts = components(ctx, key, "attribute")?;
        let (leaf, dirs) = parts.split_last().expect("split gives one part");
        let group = self.group_mut(dirs).ok_or_else(|| Error::Write {
            rule: rules::ATTRIBUTE,
            ctx: ctx.clone(),
            reason: format!(
                "metadata {key:?} names a dataset's path; file attributes go on the root \
                 (`name`) or a group (`group/name`)"
            ),
        })?;
        if group.attributes.iter().any(|(n, _)| n == leaf) {
            return Err(Error::Write {
                rule: rules::ATTRIBUTE,
                ctx: ctx.clone(),
                reason: format!("metadata {key:?} given twice"),
            });
        }
        group.attributes.push((leaf, value));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_make_groups_and_clashes_are_refused() {
        let ctx = Context::default();
        let mut root = Group::default();
        root.insert(&ctx, "a/b/c", 0).unwrap();
        root.insert(&ctx, "a/d", 1).unwrap();
        assert!(root.insert(&ctx, "a/b/c", 2).is_err());
        assert!(root.insert(&ctx, "a/b", 2).is_err());
        assert!(root.insert(&ctx, "a/d/e", 2).is_err());
        for bad in ["", "/x", "x/", "a//b", "./x"] {
            let e = root.insert(&ctx, bad, 3).unwrap_err();
            assert_eq!(e.rule(), Some(rules::NAME), "{bad:?}");
        }
        let v = Value::Int(1);
        root.attribute(&ctx, "top", &v).unwrap();
        root.attribute(&ctx, "a/b/name", &v).unwrap();
        root.attribute(&ctx, "new/group/name", &v).unwrap();
        let e = root.attribute(&ctx, "a/d/name", &v).unwrap_err();
        assert_eq!(e.rule(), Some(rules::ATTRIBUTE));
    }
}
