//! Completion hooks over the network (UCX on loopback): a notification wakes a hook on the
//! serving thread with nobody waiting, a network transfer's hook runs once something progresses
//! the backend (`Transfer::needs_progress`), and read-only memory is never exported.

use gdpath::net::{FailureMode, Token};
use gdpath::{Error, HostBuffer, HostPointer, Memory, TransferRequest};
use gdpath_testkit::ucx_serial as serial;
use std::sync::mpsc;
use std::time::Duration;

mod net_common;
use net_common::{agent, export_and_serve};

const T: Duration = Duration::from_secs(20);

#[test]
fn hooks_fire_for_notifications_and_network_transfers() {
    let _serial = serial();
    let server = agent("srv", FailureMode::Detect);
    let (exported, id, srv) = export_and_serve(&server, &[0u8; 8192], Token::none());
    let (tx, rx) = mpsc::channel();
    server
        .on_notification(move || tx.send(()).unwrap())
        .unwrap();
    let client = agent("cli", FailureMode::Detect);
    let peer = client.connect(srv.local_addr()).unwrap();
    let remote = client.register(peer.memory(id).unwrap()).unwrap();
    let local = client
        .register(Memory::host(HostBuffer::from_slice(&[5u8; 8192])))
        .unwrap();
    let t = client
        .post(
            TransferRequest::write(vec![local.desc(0, 8192)], vec![remote.desc(0, 8192)])
                .notify(*b"layer 3"),
        )
        .unwrap();
    assert!(t.needs_progress(), "the ucx backend is poll-driven");
    let t = std::sync::Arc::new(t);
    let (ttx, trx) = mpsc::channel();
    t.on_complete(move || ttx.send(()).unwrap());
    // Nobody else progresses the client's backend: a thread of its own waits (as the Python
    // binding's `await` does for such transfers), and the hook runs from inside that wait.
    let t2 = t.clone();
    let waiter = std::thread::spawn(move || {
        t2.wait_shared(Some(T))
            .map(|r| r.bytes)
            .map_err(|e| e.to_string())
    });
    trx.recv_timeout(T).expect("transfer hook");
    assert_eq!(waiter.join().unwrap().unwrap(), 8192);
    // The server's serving thread received the notification and ran the hook; nobody waited.
    rx.recv_timeout(T).expect("notification hook");
    let n = server.take_notifications();
    assert_eq!(n.len(), 1);
    assert_eq!(n[0].message, b"layer 3");
    assert!(exported.host_view().unwrap().iter().all(|&b| b == 5));
}

#[test]
fn read_only_memory_is_not_exported() {
    let _serial = serial();
    let server = agent("srv", FailureMode::Detect);
    let mut v = vec![1u8; 4096];
    let ro = server
        .register(Memory::HostPointer {
            // SAFETY: `v` outlives the region (dropped at the end of the test, after it).
            memory: unsafe { HostPointer::new(v.as_mut_ptr(), v.len(), false) },
            pinned: false,
        })
        .unwrap();
    let e = server.export(&ro).unwrap_err();
    assert!(matches!(e, Error::ReadOnlyMemory { .. }), "{e:?}");
    assert!(e.to_string().contains("peers"), "{e}");
    drop(ro);
    drop(v);
}
