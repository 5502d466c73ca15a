fn main(){ println!("{:?}", weft::smoke()); }
