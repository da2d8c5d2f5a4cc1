//! The `.kir` lexer: text to tokens, each with its 1-based line and column.

/// What a token is.
#[derive(Debug, Clone, PartialEq)]
pub enum Tok {
    /// `graph`, `Conv`, `f32`, `batch`, `inf`, `_`, ...
    Ident(String),
    /// A quoted string, escapes resolved.
    Str(String),
    Int(i64),
    Float(f64),
    /// `%k` or `%k:i`.
    Ref(u32, u32),
    /// One of `{ } ( ) [ ] , : =`.
    Punct(char),
    Eof,
}

impl Tok {
    /// How an error message shows the token.
    pub(crate) fn describe(&self) -> String {
        match self {
            Tok::Ident(s) => format!("'{s}'"),
            Tok::Str(s) => format!("string {s:?}"),
            Tok::Int(v) => format!("integer {v}"),
            Tok::Float(v) => format!("float {v:?}"),
            Tok::Ref(k, 0) => format!("%{k}"),
            Tok::Ref(k, i) => format!("%{k}:{i}"),
            Tok::Punct(c) => format!("'{c}'"),
            Tok::Eof => "the end of the file".into(),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Token {
    pub tok: Tok,
    pub line: usize,
    pub col: usize,
}

/// A lexing error: where, and what.
pub struct LexError {
    pub line: usize,
    pub col: usize,
    pub msg: String,
}

struct Lexer<'a> {
    chars: std::iter::Peekable<std::str::Chars<'a>>,
    line: usize,
    col: usize,
}

impl Lexer<'_> {
    fn peek(&mut self) -> Option<char> {
        self.chars.peek().copied()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.chars.next()?;
        if c == '\n' {
            self.line += 1;
            self.col = 1;
        } else {
            self.col += 1;
        }
        Some(c)
    }

    fn error<T>(&self, line: usize, col: usize, msg: impl Into<String>) -> Result<T, LexError> {
        Err(LexError {
            line,
            col,
            msg: msg.into(),
        })
    }

    fn digits(&mut self) -> String {
        let mut s = String::new();
        while let Some(c) = self.peek().filter(|c| c.is_ascii_digit()) {
            s.push(c);
            self.bump();
        }
        s
    }

    /// An identifier; `domain::name` (a registered op) is one identifier.
    fn ident(&mut self) -> String {
        let mut s = String::new();
        loop {
            while let Some(c) = self
                .peek()
                .filter(|&c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
            {
                s.push(c);
                self.bump();
            }
            let mut ahead = self.chars.clone();
            let qualified = ahead.next() == Some(':')
                && ahead.next() == Some(':')
                && ahead
                    .next()
                    .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
            if !qualified {
                return s;
            }
            s.push_str("::");
            self.bump();
            self.bump();
        }
    }

    fn string(&mut self, line: usize, col: usize) -> Result<String, LexError> {
        self.bump(); // the opening quote
        let mut s = String::new();
        loop {
            let (l, c) = (self.line, self.col);
            match self.bump() {
                None | Some('\n') => return self.error(line, col, "unterminated string"),
                Some('"') => return Ok(s),
                Some('\\') => match self.bump() {
                    Some('"') => s.push('"'),
                    Some('\\') => s.push('\\'),
                    Some('n') => s.push('\n'),
                    Some('t') => s.push('\t'),
                    Some('u') => {
                        if self.bump() != Some('{') {
                            return self.error(l, c, "expected '{' after \\u");
                        }
                        let mut hex = String::new();
                        while let Some(h) = self.peek().filter(|h| h.is_ascii_hexdigit()) {
                            hex.push(h);
                            self.bump();
                        }
                        let ch = u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32);
                        match (ch, self.bump()) {
                            (Some(ch), Some('}')) => s.push(ch),
                            _ => return self.error(l, c, "bad \\u{...} escape"),
                        }
                    }
                    _ => return self.error(l, c, "unknown escape (use \\\" \\\\ \\n \\t \\u{..})"),
                },
                Some(ch) => s.push(ch),
            }
        }
    }

    /// An integer or float; a leading `-` has been consumed when `neg`.
    fn number(&mut self, neg: bool, line: usize, col: usize) -> Result<Tok, LexError> {
        let mut s = String::from(if neg { "-" } else { "" });
        s.push_str(&self.digits());
        let mut float = false;
        if self.peek() == Some('.') {
            float = true;
            s.push('.');
            self.bump();
            s.push_str(&self.digits());
        }
        if matches!(self.peek(), Some('e' | 'E')) {
            float = true;
            s.push('e');
            self.bump();
            if let Some(sign) = self.peek().filter(|&c| c == '-' || c == '+') {
                s.push(sign);
                self.bump();
            }
            let exp = self.digits();
            if exp.is_empty() {
                return self.error(line, col, format!("malformed number '{s}'"));
            }
            s.push_str(&exp);
        }
        if float {
            s.parse()
                .map(Tok::Float)
                .or_else(|_| self.error(line, col, format!("malformed number '{s}'")))
        } else {
            s.parse()
                .map(Tok::Int)
                .or_else(|_| self.error(line, col, format!("integer '{s}' is out of range")))
        }
    }

    fn next(&mut self) -> Result<Token, LexError> {
        loop {
            match self.peek() {
                Some(c) if c.is_whitespace() => {
                    self.bump();
                }
                Some('#') => {
                    while self.peek().is_some_and(|c| c != '\n') {
                        self.bump();
                    }
                }
                _ => break,
            }
        }
        let (line, col) = (self.line, self.col);
        let tok = match self.peek() {
            None => Tok::Eof,
            Some('"') => Tok::Str(self.string(line, col)?),
            Some(c) if c.is_ascii_alphabetic() || c == '_' => Tok::Ident(self.ident()),
            Some(c) if c.is_ascii_digit() => self.number(false, line, col)?,
            Some('-') => {
                self.bump();
                match self.peek() {
                    Some(c) if c.is_ascii_digit() => self.number(true, line, col)?,
                    Some('i') => match self.ident().as_str() {
                        "inf" => Tok::Float(f64::NEG_INFINITY),
                        other => return self.error(line, col, format!("unexpected '-{other}'")),
                    },
                    _ => return self.error(line, col, "expected a number after '-'"),
                }
            }
            Some('%') => {
                self.bump();
                let k = self.digits();
                let Ok(k) = k.parse::<u32>() else {
                    return self.error(line, col, "expected a node number after '%'");
                };
                let mut out = 0;
                if self.peek() == Some(':') {
                    // `%k:i` has no spaces; `%k : type` never occurs after a reference.
                    self.bump();
                    let (l, c) = (self.line, self.col);
                    out = match self.digits().parse::<u32>() {
                        Ok(i) => i,
                        Err(_) => return self.error(l, c, "expected an output number after ':'"),
                    };
                }
                Tok::Ref(k, out)
            }
            Some(c) if "{}()[],:=<>?".contains(c) => {
                self.bump();
                Tok::Punct(c)
            }
            Some(c) => return self.error(line, col, format!("unexpected character {c:?}")),
        };
        Ok(Token { tok, line, col })
    }
}

/// The whole text as tokens, ending with `Eof`.
pub(crate) fn lex(text: &str) -> Result<Vec<Token>, LexError> {
    let mut lx = Lexer {
        chars: text.chars().peekable(),
        line: 1,
        col: 1,
    };
    let mut out = vec![];
    loop {
        let t = lx.next()?;
        let end = t.tok == Tok::Eof;
        out.push(t);
        if end {
            return Ok(out);
        }
    }
}
