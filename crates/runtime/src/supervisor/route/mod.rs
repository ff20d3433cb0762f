//! The loop's routing: where a command reaches the part that owns it, and
//! where what a part returns for the others (its follow-ups) is carried out,
//! in order. A part never holds the dispatcher: it gets what it reads, and
//! hands back what it needs done, so its decisions are apart from the work
//! the loop does for them (issue 26; what lets store work move off the loop).

mod sockets;
