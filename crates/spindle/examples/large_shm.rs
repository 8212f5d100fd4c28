//! Large messages: three members on shared memory with 10 KiB slots.
//! Member 0 multicasts three 4 MiB messages (each goes as ~420
//! fragments); members 1 and 2 keep multicasting small messages
//! meanwhile. Every member delivers each 4 MiB message whole, as one
//! payload, at the same place in one total order, with small messages
//! delivered around it. Member 2 takes each one in place, fragment by
//! fragment where it lies in member 0's ring (no reassembly copy), and
//! puts it together itself.
//!
//! ```sh
//! cargo run --release -p spindle --example large_shm
//! ```

use std::time::Duration;

use spindle::{Delivery, FragmentDelivery, Group, Upcalls};

const LARGE_BYTES: usize = 4 << 20;
const LARGE_COUNT: u8 = 3;
/// A small sender's last message: it saw every large one.
const END: &[u8] = b"end";

/// The application: (sender, length, first byte) of every delivery, in
/// order; the large messages are checked byte by byte.
#[derive(Default)]
struct Received {
    order: Vec<(usize, usize, u8)>,
    large: u8,
    ends: u8,
    /// Take large messages in place; the bytes staged so far.
    in_place: bool,
    staged: Vec<u8>,
}

fn large_message(k: u8) -> Vec<u8> {
    (0..LARGE_BYTES).map(|i| (i % 251) as u8 ^ k).collect()
}

impl Upcalls for Received {
    fn takes_fragments(&self) -> bool {
        self.in_place
    }
    fn deliver_fragment(&mut self, f: &FragmentDelivery<'_>) {
        // In order, each once: stage it (a real application might hash
        // it or write it out instead).
        assert_eq!(self.staged.len() as u64, f.offset);
        self.staged.extend_from_slice(f.data);
        if f.is_last() {
            // Delivered with its last fragment, in its place in the order.
            let whole = std::mem::take(&mut self.staged);
            self.deliver(&f.whole(&whole));
        }
    }
    fn deliver(&mut self, d: &Delivery<'_>) {
        if d.payload.len() == LARGE_BYTES {
            let k = d.payload[0];
            assert!(
                d.payload == large_message(k).as_slice(),
                "large message {k} arrived damaged"
            );
            self.large += 1;
        } else if d.payload == END {
            self.ends += 1;
        }
        self.order
            .push((d.sender_rank, d.payload.len(), d.payload.first().copied().unwrap_or(0)));
    }
    fn large_message_cut(&mut self, view: u64, sender: usize, id: u64, len: u64) {
        // Only a view change (or an abandoned send) cuts one; none here.
        panic!("large message {id} ({len} B) of member {sender} cut in view {view}");
    }
}

fn member(rank: usize, name: &str) -> Result<Received, spindle::Error> {
    let mut group = Group::builder(name)
        .members(3)
        .rank(rank)
        .app(Received {
            in_place: rank == 2,
            ..Received::default()
        })
        .join()?;
    if rank == 0 {
        for k in 0..LARGE_COUNT {
            // Returns once every fragment is in the window; polls meanwhile.
            group.send_large(&large_message(k))?;
        }
    } else {
        let mut i = 0u32;
        while group.app().large < LARGE_COUNT {
            match group.send(&i.to_le_bytes()) {
                Ok(()) => i += 1,
                Err(spindle::Error::Send(spindle::SendError::WouldBlock)) => {}
                Err(e) => return Err(e),
            }
            group.poll_or_idle()?;
        }
        while group.send(END).is_err() {
            group.poll_or_idle()?;
        }
    }
    group.run_until(Duration::from_secs(60), |r| r.large == LARGE_COUNT && r.ends == 2)?;
    group.finish_together(Duration::from_secs(30))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let name = format!("large-shm-{}", std::process::id());
    let threads: Vec<_> = (0..3)
        .map(|rank| {
            let name = name.clone();
            std::thread::spawn(move || member(rank, &name))
        })
        .collect();
    let received = threads
        .into_iter()
        .map(|t| t.join().expect("a member thread panicked"))
        .collect::<Result<Vec<_>, _>>()?;
    assert!(
        received.iter().all(|r| r.order == received[0].order),
        "total order: every member delivers the same sequence"
    );
    let order = &received[0].order;
    let at: Vec<usize> = order
        .iter()
        .enumerate()
        .filter(|(_, d)| d.1 == LARGE_BYTES)
        .map(|(i, _)| i)
        .collect();
    for (k, i) in at.iter().enumerate() {
        let before = order[..*i].iter().filter(|d| d.0 != 0).count();
        println!(
            "4 MiB message {k}: delivered whole at every member, as delivery {i} of {} (after {before} small messages)",
            order.len()
        );
    }
    println!(
        "OK: 3 members delivered the same {} messages in one order, each large one whole",
        order.len()
    );
    Ok(())
}
