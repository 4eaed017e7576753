//! Dense and Ragged record stores on the loaderx 2.3 layout. Filled by the zrecord issue.
