//! XML parsing for the hwloc and NCCL readers, with the limits of [`crate::input`]: at most
//! [`MAX_XML_NODES`] nodes and [`MAX_XML_DEPTH`] levels of elements.
//!
//! roxmltree parses without recursion and keeps its nodes in one flat array, so deep input cannot
//! overflow the stack while parsing; the readers walk the tree recursively, which is why the depth
//! is checked first, without recursion (one pass in document order).

use crate::input::{MAX_XML_DEPTH, MAX_XML_NODES};
use crate::TopoError;
use roxmltree::{Document, Node, ParsingOptions};
use std::path::Path;

/// Parses XML text. Errors: [`TopoError::Xml`] with file, line and column for malformed XML,
/// [`TopoError::TooManyNodes`] past [`MAX_XML_NODES`], [`TopoError::TooDeep`] past
/// [`MAX_XML_DEPTH`] (at the first element too deep).
pub(crate) fn parse<'a>(text: &'a str, path: &Path) -> Result<Document<'a>, TopoError> {
    let opts = ParsingOptions {
        allow_dtd: true,
        nodes_limit: MAX_XML_NODES,
        ..Default::default()
    };
    let doc = Document::parse_with_options(text, opts).map_err(|e| match e {
        roxmltree::Error::NodesLimitReached => TopoError::TooManyNodes {
            path: path.to_owned(),
            limit: MAX_XML_NODES,
        },
        e => {
            let pos = e.pos();
            TopoError::Xml {
                path: path.to_owned(),
                line: pos.row,
                column: pos.col,
                message: e.to_string(),
            }
        }
    })?;
    // Element depth of each node, parents being visited before their children.
    let mut depth: Vec<u32> = Vec::new();
    for n in doc.descendants() {
        let i = n.id().get_usize();
        let up = n.parent().map_or(0, |p| depth[p.id().get_usize()]);
        let d = up + u32::from(n.is_element());
        if d as usize > MAX_XML_DEPTH {
            let pos = doc.text_pos_at(n.range().start);
            return Err(TopoError::TooDeep {
                path: path.to_owned(),
                line: pos.row,
                column: pos.col,
                limit: MAX_XML_DEPTH,
            });
        }
        if depth.len() <= i {
            depth.resize(i + 1, 0);
        }
        depth[i] = d;
    }
    Ok(doc)
}

/// [`TopoError::Xml`] at a node of a parsed document.
pub(crate) fn error(doc: &Document, node: Node, path: &Path, message: String) -> TopoError {
    let pos = doc.text_pos_at(node.range().start);
    TopoError::Xml {
        path: path.to_owned(),
        line: pos.row,
        column: pos.col,
        message,
    }
}

/// Line numbers of byte offsets, in O(log n) each: [`Document::text_pos_at`] counts from the
/// start of the text, which for a note per element would be quadratic in the file size.
pub(crate) struct LineIndex(Vec<usize>);

impl LineIndex {
    /// The line starts of `text`.
    pub(crate) fn new(text: &str) -> Self {
        let starts = std::iter::once(0)
            .chain(text.match_indices('\n').map(|(i, _)| i + 1))
            .collect();
        LineIndex(starts)
    }

    /// The 1-based line of a node.
    pub(crate) fn line(&self, node: Node) -> u32 {
        let at = node.range().start;
        u32::try_from(self.0.partition_point(|&s| s <= at)).unwrap_or(u32::MAX)
    }
}
