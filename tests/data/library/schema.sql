CREATE TABLE settings ( -- desk settings read by the triggers
  settings_id INTEGER PRIMARY KEY CHECK (settings_id = 1),
  today TEXT NOT NULL
);

CREATE TABLE member ( -- library members
  member_id TEXT PRIMARY KEY NOT NULL, -- e.g. M-7
  name TEXT NOT NULL,
  tier TEXT NOT NULL CHECK (tier IN ('standard', 'plus')),
  status TEXT NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'blocked'))
);

CREATE TABLE tier_limit ( -- loan limit per tier
  tier TEXT PRIMARY KEY NOT NULL,
  max_loans INTEGER NOT NULL
);

CREATE TABLE book ( -- titles and the copies on the shelf
  book_id TEXT PRIMARY KEY NOT NULL,
  title TEXT NOT NULL,
  copies_on_shelf INTEGER NOT NULL CHECK (copies_on_shelf >= 0)
);

CREATE TABLE loan ( -- loans of one copy
  loan_id INTEGER PRIMARY KEY,
  member_id TEXT NOT NULL REFERENCES member(member_id),
  book_id TEXT NOT NULL REFERENCES book(book_id),
  renewals INTEGER NOT NULL DEFAULT 0,
  status TEXT NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'returned'))
);

CREATE TABLE fine ( -- fines owed by members
  fine_id INTEGER PRIMARY KEY,
  member_id TEXT NOT NULL REFERENCES member(member_id),
  amount REAL NOT NULL CONSTRAINT fine_positive CHECK (amount > 0),
  paid INTEGER NOT NULL DEFAULT 0 CHECK (paid IN (0, 1))
);

CREATE TABLE event ( -- journal written by the triggers
  event_id INTEGER PRIMARY KEY,
  what TEXT NOT NULL
);

CREATE TRIGGER loan_borrow_rules
BEFORE INSERT ON loan
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: member_in_good_standing: only active members can borrow')
  WHERE (SELECT status FROM member WHERE member_id = NEW.member_id) IS NOT 'active';
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: unpaid_fines: members with an unpaid fine cannot borrow')
  WHERE EXISTS (SELECT 1 FROM fine WHERE member_id = NEW.member_id AND paid = 0);
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: loan_limit: the member has reached the loan limit of their tier')
  WHERE (SELECT COUNT(*) FROM loan WHERE member_id = NEW.member_id AND status = 'active')
        >= (SELECT max_loans FROM tier_limit WHERE tier = (SELECT tier FROM member WHERE member_id = NEW.member_id));
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: copy_available: no copy of this book is on the shelf')
  WHERE (SELECT copies_on_shelf FROM book WHERE book_id = NEW.book_id) < 1;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: new_loan_active: new loans are created active')
  WHERE NEW.status <> 'active' OR NEW.renewals <> 0;
END;

CREATE TRIGGER loan_after_borrow
AFTER INSERT ON loan
BEGIN
  -- One copy leaves the shelf and the loan is journaled
  UPDATE book SET copies_on_shelf = copies_on_shelf - 1 WHERE book_id = NEW.book_id;
  INSERT INTO event (what) VALUES ('borrow ' || NEW.book_id);
END;

CREATE TRIGGER loan_returned_final
BEFORE UPDATE ON loan
WHEN OLD.status = 'returned'
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: returned_is_final: a returned loan cannot change');
END;

CREATE TRIGGER loan_renewal_rules
BEFORE UPDATE OF renewals ON loan
WHEN NEW.renewals IS NOT OLD.renewals
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: renewal_limit: a loan can be renewed at most 2 times')
  WHERE NEW.renewals > 2 OR NEW.renewals < OLD.renewals;
END;

CREATE TRIGGER loan_after_return
AFTER UPDATE OF status ON loan
WHEN NEW.status = 'returned' AND OLD.status = 'active'
BEGIN
  -- The copy goes back on the shelf
  UPDATE book SET copies_on_shelf = copies_on_shelf + 1 WHERE book_id = NEW.book_id;
  INSERT INTO event (what) VALUES ('return ' || NEW.book_id);
END;
