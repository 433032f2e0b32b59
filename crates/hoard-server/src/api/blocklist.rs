//! The Put Block List body (PROTOCOL.md §3.4):
//! `<BlockList><Latest>id</Latest><Committed>id</Committed><Uncommitted>id</Uncommitted></BlockList>`.

use quick_xml::events::Event;
use quick_xml::Reader;

use crate::model::BlockId;
use crate::model::{BlockRef, BlockSource};

/// Azure's limit on the number of blocks in a blob.
pub const MAX_BLOCKS: usize = 50_000;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadBlockList {
    #[error("{0}")]
    Malformed(String),
    #[error("the block list may not contain more than {MAX_BLOCKS} blocks")]
    TooLong,
}

pub fn parse(body: &[u8]) -> Result<Vec<BlockRef>, BadBlockList> {
    let bad = |msg: &str| BadBlockList::Malformed(msg.to_owned());
    let mut reader = Reader::from_reader(body);
    reader.config_mut().trim_text(true);
    let mut list = Vec::new();
    let mut in_list = false;
    let mut saw_list = false;
    let mut current: Option<(BlockSource, Vec<u8>)> = None;
    loop {
        let event = reader.read_event().map_err(|e| {
            BadBlockList::Malformed(format!("the block list is not well-formed XML: {e}"))
        })?;
        match event {
            Event::Decl(_) | Event::Comment(_) | Event::PI(_) | Event::DocType(_) => {}
            Event::Start(e) if !in_list => {
                if e.local_name().as_ref() != b"BlockList" || saw_list {
                    return Err(bad("the root element must be <BlockList>"));
                }
                in_list = true;
                saw_list = true;
            }
            Event::Empty(e) if !in_list && e.local_name().as_ref() == b"BlockList" && !saw_list => {
                saw_list = true;
            }
            Event::Start(e) if current.is_none() => {
                let source = match e.local_name().as_ref() {
                    b"Latest" => BlockSource::Latest,
                    b"Committed" => BlockSource::Committed,
                    b"Uncommitted" => BlockSource::Uncommitted,
                    _ => {
                        return Err(bad(
                            "<BlockList> may only hold <Latest>, <Committed> and <Uncommitted>",
                        ))
                    }
                };
                current = Some((source, Vec::new()));
            }
            Event::Text(t) => match current.as_mut() {
                Some((_, id)) => {
                    let text = t.decode().map_err(|e| {
                        BadBlockList::Malformed(format!("bad text in the block list: {e}"))
                    })?;
                    id.extend_from_slice(text.trim().as_bytes());
                }
                None => return Err(bad("text outside a block element")),
            },
            // `&amp;`, `&#65;`: quick-xml hands entity references over on their own.
            Event::GeneralRef(r) => match current.as_mut() {
                Some((_, id)) => {
                    let unknown = || bad("unknown entity in the block list");
                    let ch = match r.resolve_char_ref().map_err(|_| unknown())? {
                        Some(ch) => ch,
                        None => {
                            let name = r.decode().map_err(|_| unknown())?;
                            quick_xml::escape::resolve_predefined_entity(&name)
                                .and_then(|s| s.chars().next())
                                .ok_or_else(unknown)?
                        }
                    };
                    id.extend_from_slice(ch.encode_utf8(&mut [0; 4]).as_bytes());
                }
                None => return Err(bad("text outside a block element")),
            },
            Event::CData(t) => match current.as_mut() {
                Some((_, id)) => id.extend_from_slice(t.as_ref()),
                None => return Err(bad("text outside a block element")),
            },
            Event::End(_) => match current.take() {
                Some((source, id)) => {
                    let id =
                        BlockId::parse(&id).map_err(|e| BadBlockList::Malformed(e.to_string()))?;
                    if list.len() == MAX_BLOCKS {
                        return Err(BadBlockList::TooLong);
                    }
                    list.push(BlockRef { id, source });
                }
                None if in_list => in_list = false,
                None => return Err(bad("unbalanced XML")),
            },
            Event::Eof => break,
            _ => return Err(bad("unexpected content in the block list")),
        }
    }
    if !saw_list || in_list || current.is_some() {
        return Err(bad("the body is not a complete <BlockList>"));
    }
    Ok(list)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(list: &[BlockRef]) -> Vec<(&[u8], BlockSource)> {
        list.iter().map(|b| (b.id.as_bytes(), b.source)).collect()
    }

    #[test]
    fn parses_what_the_js_sdk_sends() {
        let body = br#"<?xml version="1.0" encoding="UTF-8" standalone="yes"?><BlockList><Latest>YTAw</Latest><Latest>YTAx</Latest></BlockList>"#;
        let list = parse(body).unwrap();
        assert_eq!(
            ids(&list),
            [
                (&b"YTAw"[..], BlockSource::Latest),
                (&b"YTAx"[..], BlockSource::Latest)
            ]
        );
    }

    #[test]
    fn accepts_every_source_and_escaped_ids() {
        let body = b"<BlockList>\n  <Committed>a+/=</Committed>\n  <Uncommitted>b&amp;c</Uncommitted>\n  <Latest>d&#65;&#x42;</Latest>\n</BlockList>";
        let list = parse(body).unwrap();
        assert_eq!(
            ids(&list),
            [
                (&b"a+/="[..], BlockSource::Committed),
                (&b"b&c"[..], BlockSource::Uncommitted),
                (&b"dAB"[..], BlockSource::Latest)
            ]
        );
        assert!(parse(b"<BlockList/>").unwrap().is_empty());
    }

    #[test]
    fn refuses_malformed_lists() {
        for bad in [
            &b""[..],
            b"not xml",
            b"<BlockList><Latest>&bogus;</Latest></BlockList>",
            b"<BlockList><Latest>a</Latest>",
            b"<Other><Latest>a</Latest></Other>",
            b"<BlockList><Block>a</Block></BlockList>",
            b"<BlockList><Latest></Latest></BlockList>",
            b"<BlockList><Latest><Latest>a</Latest></Latest></BlockList>",
            b"<BlockList>text</BlockList>",
            b"<BlockList></BlockList><BlockList></BlockList>",
        ] {
            assert!(parse(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }
}
